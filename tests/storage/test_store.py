"""One contract suite for ``Store``, bound to local disk, ``memory://`` and S3 (moto server)."""

import pickle
import uuid

import pytest

from shardkit.errors import StorageError
from shardkit.storage import Store, is_remote


@pytest.fixture(params=["local", "memory", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return Store(str(tmp_path / "d"))
    if request.param == "memory":
        return Store(f"memory://shardkit-tests/{uuid.uuid4().hex}")
    options = request.getfixturevalue("s3_server")
    return Store(request.getfixturevalue("s3_bucket") + "/ds", options)


def test_write_read_list_remove(store):
    assert not store.exists()
    assert store.listdir() == [] and store.file_sizes() == {}
    store.makedirs()
    store.write_bytes("b.bin", b"hello")
    with store.write_atomic("a.bin") as f:
        f.write(b"x" * 1000)
    assert store.listdir() == ["a.bin", "b.bin"]
    sub = store.child("sub")
    sub.makedirs()
    sub.write_bytes("c.bin", b"c")  # a folder is listed by listdir, not by file_sizes
    assert store.file_sizes() == {"a.bin": 1000, "b.bin": 5}
    store.remove("sub")
    assert store.read_bytes("b.bin") == b"hello"
    assert store.size("a.bin") == 1000
    with store.open_read("a.bin") as f:
        assert f.read(3) == b"xxx"
    store.write_bytes("b.bin", b"replaced")
    assert store.read_bytes("b.bin") == b"replaced"
    store.remove("b.bin")
    store.remove("b.bin")  # missing_ok
    assert store.listdir() == ["a.bin"]
    with pytest.raises(StorageError):
        store.remove("b.bin", missing_ok=False)


def test_sub_stores(store):
    sub = store.child("state")
    sub.makedirs()
    sub.write_bytes("r.json", b"{}")
    assert sub.read_bytes("r.json") == b"{}"
    assert "state" in store.listdir()
    store.remove("state")
    assert not sub.exists("r.json")


def test_failed_atomic_write_leaves_nothing_visible(store):
    store.makedirs()
    store.write_bytes("keep.bin", b"old")
    for name in ["new.bin", "keep.bin"]:
        with pytest.raises(RuntimeError), store.write_atomic(name) as f:
            f.write(b"partial" * 1000)
            raise RuntimeError("boom")
    assert store.listdir() == ["keep.bin"]
    assert store.read_bytes("keep.bin") == b"old"


def test_a_ctrl_c_as_an_atomic_write_opens_its_temporary_leaves_none(tmp_path, monkeypatch):
    """Interrupted after the temporary was made but before the write began, a 0-byte
    ``.<name>.tmp-…`` stayed beside the dataset (seen after Ctrl-C in ``shardkit index``)."""
    import builtins

    from shardkit.storage import store as store_module

    local = Store(str(tmp_path / "ds"))
    local.makedirs()

    def interrupted_open(path, mode="r", *args, **kwargs):
        builtins.open(path, mode, *args, **kwargs).close()  # the file exists, then the signal lands
        raise KeyboardInterrupt

    monkeypatch.setattr(store_module, "open", interrupted_open, raising=False)
    with pytest.raises(KeyboardInterrupt), local.write_atomic("x.idx"):
        pass
    assert local.listdir() == []


def test_caller_errors_inside_an_atomic_write_keep_their_type(store):
    store.makedirs()
    with pytest.raises(UnicodeEncodeError), store.write_atomic("a.json") as f:
        f.write("caf\udce9".encode())  # the caller's own encoding error is not a storage error
    with pytest.raises(OSError) as err, store.write_atomic("b.bin"):
        raise OSError("the caller's disk-free check")
    assert not isinstance(err.value, StorageError)
    assert store.listdir() == []


def test_missing_files_raise_storage_error_naming_them(store):
    store.makedirs()
    with pytest.raises(StorageError, match="nope.bin"):
        store.read_bytes("nope.bin")
    with pytest.raises(StorageError, match="nope.bin"):
        store.size("nope.bin")


def test_read_optional_returns_none_only_for_missing_files(store):
    store.makedirs()
    store.write_bytes("here.bin", b"data")
    assert store.read_optional("here.bin") == b"data"
    assert store.read_optional("absent.bin") is None


def test_pickles_without_its_filesystem(store):
    store.makedirs()
    store.write_bytes("a", b"1")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read_bytes("a") == b"1"


def test_makedirs_on_a_file_says_so(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(StorageError, match="f: is a file, not a directory"):
        Store(str(tmp_path / "f")).makedirs()


def test_local_paths_and_urls(tmp_path):
    assert not is_remote("/data/x") and not is_remote("file:///data/x") and not is_remote("rel/x")
    assert is_remote("s3://b/x") and is_remote("memory://x")
    store = Store(f"file://{tmp_path}/")
    assert store.path("a") == f"{tmp_path}/a"
    store.write_bytes("a", b"1")
    assert (tmp_path / "a").read_bytes() == b"1"
    with pytest.raises(StorageError, match="nosuchproto"):
        Store("nosuchproto://x").listdir()


def test_a_path_through_a_file_names_the_file(tmp_path) -> None:
    from shardkit.errors import StorageError
    from shardkit.storage import Store

    (tmp_path / "notes.txt").write_text("hi")
    store = Store(str(tmp_path / "notes.txt" / "sub"))
    with pytest.raises(StorageError, match=rf"{tmp_path / 'notes.txt'} is a file, not a directory"):
        store.makedirs()


@pytest.mark.parametrize(("code", "said"), [(30, "read-only file system"), (28, "no space left on the device")])
def test_a_local_write_error_is_said_in_words(tmp_path, monkeypatch, code, said) -> None:
    import errno
    import os

    assert errno.errorcode[code] in ("EROFS", "ENOSPC")
    target = tmp_path / "out"

    def refuse(path: str, *args: object, **kw: object) -> None:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(os, "makedirs", refuse)
    with pytest.raises(StorageError) as err:
        Store(str(target)).makedirs()
    assert str(err.value) == f"{target}: {said} ({target})"
    assert "Errno" not in str(err.value) and "OSError" not in str(err.value)


@pytest.mark.parametrize("url", ["s3:/bucket/train", "S3:bucket/train", "gs:/b/x", "memory:/x"])
def test_a_url_with_one_slash_is_refused_by_the_python_api_too(url, tmp_path):
    from shardkit import ShardLoader
    from shardkit.errors import SourceError
    from shardkit.pack import pack

    fixed = f"{url.split(':')[0]}://{url.split(':', 1)[1].lstrip('/')}"
    with pytest.raises(StorageError, match=f"a URL needs two slashes: {fixed}$"):
        Store(url)
    with pytest.raises(StorageError, match="a URL needs two slashes"):
        ShardLoader(url, batch_size=2)
    with pytest.raises(SourceError, match="a URL needs two slashes"):
        pack(url, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_local_folder_named_like_a_scheme_is_still_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "data").mkdir(parents=True)
    Store("s3:/data").write_bytes("x", b"1")
    assert (tmp_path / "s3:" / "data" / "x").read_bytes() == b"1"
    sub = Store("s3:/data").child("sub")  # a path in it that does not exist yet
    sub.makedirs()
    sub.write_bytes("y", b"2")
    Store("s3:/new").makedirs()
    assert (tmp_path / "s3:" / "data" / "sub" / "y").read_bytes() == b"2" and (tmp_path / "s3:" / "new").is_dir()
