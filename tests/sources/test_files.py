"""``Files``, the one interface sources list and read through: one contract, bound to the local
disk, ``memory://`` and S3 (the moto server). The same tree gives the same listing, order,
bytes and skip reasons from each."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from shardkit.errors import SourceError, StorageError
from shardkit.sources import SourceSample, scan_imagefolder
from shardkit.sources.files import MAX_INPUT_BYTES, Files, SkipSample
from shardkit.sources.open import open_files
from shardkit.sources.remote import READ_AHEAD_BYTES, READ_THREADS, RemoteFiles
from tests.conftest import encode_image, upload_tree, write_tree

#: Names whose order tells os.walk's (directory by directory, sorted) from a plain sort of paths:
#: "sub-x" < "sub.d" < "sub/" as strings, but os.walk lists cat/ before cat/sub/ before cat/sub-x/.
TREE = {
    "cat/b.jpg": encode_image((9, 7)),
    "cat/A.JPG": encode_image((10, 7)),
    "cat/sub/x.jpg": encode_image((11, 7)),
    "cat/sub-x/y.jpg": encode_image((12, 7)),
    "cat/sub.d/z.png": encode_image((13, 7), fmt="PNG"),
    "cat/zz.jpg": encode_image((14, 7)),
    "cat/notes.txt": b"not an image extension",
    "dog/ünï/ça.jpeg": encode_image((15, 7)),
    "dog/empty.jpg": b"",
    "dog/text.jpg": b"hello, not an image",
    "emu/deep/er/est.png": encode_image((16, 7), fmt="PNG"),
    "top.jpg": encode_image((17, 7)),  # beside the classes: not a sample
}


@pytest.fixture
def local_tree(tmp_path: Path) -> Path:
    write_tree(tmp_path / "tree", TREE)
    return tmp_path / "tree"


@pytest.fixture(params=["local", "memory", "s3"])
def where(request: pytest.FixtureRequest, local_tree: Path) -> tuple[str, dict[str, Any] | None]:
    """The tree's root URL in each backend, and its storage options."""
    if request.param == "local":
        return str(local_tree), None
    if request.param == "memory":
        url = f"memory://files-tests/{uuid.uuid4().hex}/tree"
        upload_tree(local_tree, url)
        return url, None
    options = request.getfixturevalue("s3_server")
    url = f"{request.getfixturevalue('s3_bucket')}/tree"
    upload_tree(local_tree, url, options)
    return url, options


def _rows(files: Files, entries: Any) -> list[tuple[str, int]]:
    return [(e.rel, e.size) for e in entries]


def test_listing_is_the_same_everywhere(where: tuple[str, dict[str, Any] | None],
                                        local_tree: Path) -> None:
    url, options = where
    files, local = open_files(url, options), open_files(str(local_tree))
    assert files.is_dir() and files.subdirs() == local.subdirs() == ["cat", "dog", "emu"]
    walked = files.walk(["cat", "dog", "emu"])
    assert [_rows(files, e) for e in walked] == [_rows(local, e) for e in local.walk(["cat", "dog", "emu"])]
    assert [e.rel for e in walked[0]] == ["cat/A.JPG", "cat/b.jpg", "cat/notes.txt", "cat/zz.jpg",
                                          "cat/sub/x.jpg", "cat/sub-x/y.jpg", "cat/sub.d/z.png"]
    assert all(e.version for es in walked for e in es)  # mtime or ETag: what resume compares
    stat = files.stat(["cat/b.jpg", "dog/ünï/ça.jpeg", "cat/missing.jpg"])
    assert [(e.rel, e.size) for e in stat] == [("cat/b.jpg", len(TREE["cat/b.jpg"])),
                                               ("dog/ünï/ça.jpeg", len(TREE["dog/ünï/ça.jpeg"])),
                                               ("cat/missing.jpg", -1)]
    remote = scan_imagefolder(url, storage_options=options)
    reference = scan_imagefolder(str(local_tree))
    assert remote.classes == reference.classes
    assert ([(s.rel, s.size, s.label) for s in remote.samples]
            == [(s.rel, s.size, s.label) for s in reference.samples])
    assert remote.files.remote == (url != str(local_tree))


def test_reads_give_the_same_bytes_and_skip_reasons(where: tuple[str, dict[str, Any] | None],
                                                    local_tree: Path) -> None:
    url, options = where
    listing = scan_imagefolder(url, storage_options=options)
    reference = scan_imagefolder(str(local_tree))
    gone = SourceSample(listing.files.root + "/cat/gone.jpg", "cat/gone.jpg", -1)
    gone_local = SourceSample(str(local_tree / "cat/gone.jpg"), "cat/gone.jpg", -1)

    def show(read: bytes | SkipSample) -> bytes | str:
        return read.reason if isinstance(read, SkipSample) else read

    got = [show(r) for r in listing.files.read_each([*listing.samples, gone])]
    expected = [show(r) for r in reference.files.read_each([*reference.samples, gone_local])]
    assert got == expected
    assert "empty file (0 bytes)" in got and "unreadable file (No such file or directory)" in got


def test_size_cap_applies_to_the_listed_size_before_reading(s3_server: dict[str, Any],
                                                            s3_bucket: str) -> None:
    files = RemoteFiles(f"{s3_bucket}/tree", s3_server)
    # No such object: a read would say "unreadable"; the listed size alone decides.
    huge = SourceSample(f"{files.root}/cat/huge.jpg", "cat/huge.jpg", MAX_INPUT_BYTES + 1)
    [skip] = list(files.read_each([huge]))
    assert isinstance(skip, SkipSample)
    assert skip.reason == f"file too large ({MAX_INPUT_BYTES + 1} bytes; at most {MAX_INPUT_BYTES} are packed)"


def test_an_object_grown_since_listing_is_read_only_up_to_the_cap(
        s3_server: dict[str, Any], s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardkit.sources.remote as remote

    monkeypatch.setattr(remote, "MAX_INPUT_BYTES", 1000)
    files = RemoteFiles(f"{s3_bucket}/tree", s3_server)
    files.store.write_bytes("cat/grown.jpg", b"x" * 5000)
    reads: list[int] = []
    real = files.store.read_bytes

    def spy(name: str, *, limit: int | None = None) -> bytes:
        data = real(name, limit=limit)
        reads.append(len(data))
        return data

    monkeypatch.setattr(files.store, "read_bytes", spy)
    [skip] = list(files.read_each([SourceSample(f"{files.root}/cat/grown.jpg", "cat/grown.jpg", 10)]))
    assert isinstance(skip, SkipSample) and skip.reason.startswith("file too large (grew past 1000")
    assert reads == [1001]  # a ranged GET: never more than the cap and one byte


def test_reads_are_concurrent_bounded_and_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://files-tests/{uuid.uuid4().hex}"
    files = RemoteFiles(url)
    names = [f"c/{i:03d}.jpg" for i in range(40)]
    for i, name in enumerate(names):
        files.store.write_bytes(name, str(i).encode())
    active, peak, lock = 0, 0, threading.Lock()
    real = files.store.read_bytes

    def slow(name: str, *, limit: int | None = None) -> bytes:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.02)
        with lock:
            active -= 1
        return real(name, limit=limit)

    monkeypatch.setattr(files.store, "read_bytes", slow)
    samples = [SourceSample(f"{url}/{n}", n, 3) for n in names]
    assert list(files.read_each(samples)) == [str(i).encode() for i in range(40)]
    assert 1 < peak <= READ_THREADS
    # Listed sizes bound the bytes in flight: two of 40% of the budget at most
    big = [SourceSample(f"{url}/{n}", n, READ_AHEAD_BYTES * 4 // 10) for n in names[:10]]
    peak = 0
    assert len(list(files.read_each(big))) == 10 and peak <= 2


def test_remote_errors_name_the_url(s3_server: dict[str, Any], s3_bucket: str,
                                    local_tree: Path) -> None:
    upload_tree(local_tree, f"{s3_bucket}/tree", s3_server)
    with pytest.raises(SourceError, match="source directory does not exist") as err:
        scan_imagefolder(f"{s3_bucket}/nope", storage_options=s3_server)
    assert err.value.where == f"{s3_bucket}/nope"
    missing = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorageError, match=f"bucket '{missing}' does not exist"):
        scan_imagefolder(f"s3://{missing}/train", storage_options=s3_server)
    with pytest.raises(SourceError, match="not a directory"):
        scan_imagefolder(f"{s3_bucket}/tree/top.jpg", storage_options=s3_server)
    with pytest.raises(SourceError, match="no class folders"):
        scan_imagefolder(f"{s3_bucket}/tree/emu/deep/er", storage_options=s3_server)
    other = RemoteFiles(f"{s3_bucket}/other", s3_server).store
    other.write_bytes("a/x.jpg", encode_image())
    other.write_bytes("b/readme.txt", b"x")
    with pytest.raises(SourceError, match=r"no image files in class folder b \(pack --allow-empty"):
        scan_imagefolder(f"{s3_bucket}/other", storage_options=s3_server)


def test_local_files_keep_the_hostile_input_rules(tmp_path: Path) -> None:
    import os

    write_tree(tmp_path, {"c/ok.jpg": encode_image()})
    os.mkfifo(tmp_path / "c" / "pipe.jpg")
    os.symlink("/dev/zero", tmp_path / "c" / "zero.jpg")
    listing = scan_imagefolder(str(tmp_path))
    reads = dict(zip([s.rel for s in listing.samples], listing.files.read_each(listing.samples), strict=True))
    assert reads["c/ok.jpg"] == encode_image()
    assert [reads[n].reason for n in ("c/pipe.jpg", "c/zero.jpg")] == [  # type: ignore[union-attr]
        "not a regular file (a FIFO)", "not a regular file (a character device)"]


def test_files_pickle_without_their_listing(s3_server: dict[str, Any], s3_bucket: str,
                                            local_tree: Path) -> None:
    import pickle

    upload_tree(local_tree, f"{s3_bucket}/tree", s3_server)
    files = RemoteFiles(f"{s3_bucket}/tree", s3_server)
    files.stat(["cat/b.jpg"])
    clone = pickle.loads(pickle.dumps(files))
    assert clone._index is None and clone.store._fs is None
    assert clone.stat(["cat/b.jpg"])[0].size == len(TREE["cat/b.jpg"])
