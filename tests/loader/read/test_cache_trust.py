"""The shard cache trusts nothing it did not check: a cached file's bytes are hashed before a
process first uses it, the default directory is the user's own (``0700``), a fetch stops at the
manifest's size, and the temporary files of a fetch killed mid-way are removed."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardkit.errors import LoaderError
from shardkit.index.manifest import ShardEntry
from shardkit.loader.read.cache import ShardCache, default_cache_dir
from shardkit.loader.read.reader import ShardReader
from shardkit.storage import Store

DATA = b"true bytes " * 100
ENTRY = ShardEntry(url="s.tar", num_samples=1, num_bytes=len(DATA), sha256=hashlib.sha256(DATA).hexdigest())


class _Store:
    """Serves ``data`` for every name, counting the opens; ``endless`` never ends the stream."""

    def __init__(self, data: bytes = DATA, *, endless: bool = False) -> None:
        self.data, self.endless, self.opens, self.served = data, endless, 0, 0

    def open_read(self, name: str) -> io.RawIOBase:
        self.opens += 1
        store = self

        class Stream(io.RawIOBase):
            pos = 0

            def readable(self) -> bool:
                return True

            def read(self, n: int = -1) -> bytes:
                chunk = (b"z" * n) if store.endless else store.data[self.pos:self.pos + n]
                self.pos += len(chunk)
                store.served += len(chunk)
                return chunk

        return Stream()

    def path(self, name: str) -> str:
        return f"memory://x/{name}"


def test_a_planted_shard_of_the_right_size_is_fetched_again_not_served(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "c"))
    os.makedirs(cache.directory)
    planted = DATA.replace(b"true", b"fake")
    Path(cache.path(ENTRY)).write_bytes(planted)  # same size, other label
    store = _Store()
    fd = cache.open(store, ENTRY)  # type: ignore[arg-type]
    try:
        assert os.pread(fd, len(DATA) + 1, 0) == DATA and store.opens == 1
    finally:
        os.close(fd)
    os.close(cache.open(store, ENTRY))  # type: ignore[arg-type]  # verified now: no second fetch
    assert store.opens == 1


def test_a_fetch_stops_at_the_manifests_size(tmp_path: Path) -> None:
    store = _Store(endless=True)
    with pytest.raises(LoaderError, match=f"s.tar: the object is larger than the {len(DATA)} bytes index.json says"):
        ShardCache(str(tmp_path / "c")).open(store, ENTRY)  # type: ignore[arg-type]
    assert store.served <= len(DATA) + 1
    assert not list((tmp_path / "c").iterdir())


def test_the_temporary_file_of_a_killed_fetch_is_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cache = ShardCache(str(tmp_path / "c"))
    os.makedirs(cache.directory)
    orphan = Path(f"{cache.path(ENTRY)}.tmp-{dead.pid}")
    fresh = Path(f"{cache.path(ENTRY)}.tmp-{os.getpid() + 10**6}")  # recently written: maybe still in use
    for path in (orphan, fresh):
        path.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    os.close(cache.open(_Store(), ENTRY))  # type: ignore[arg-type]
    assert not orphan.exists() and fresh.exists()


def test_the_default_cache_is_the_users_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "shardkit")
    reader = ShardReader(Store("memory://x"), (ENTRY,), cache_dir=default_cache_dir())
    assert reader.cache is not None and reader.cache.private
    os.close(reader.cache.open(_Store(), ENTRY))  # type: ignore[arg-type]
    assert stat.S_IMODE(os.stat(default_cache_dir()).st_mode) == 0o700
    os.chmod(default_cache_dir(), 0o777)  # as another user could have made it
    with pytest.raises(LoaderError, match="shard cache directory is writable by others .mode 777."):
        reader.cache.open(_Store(), ENTRY)  # type: ignore[arg-type]
