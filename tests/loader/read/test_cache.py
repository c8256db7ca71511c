"""The remote-shard cache: keyed by content hash (re-packed URLs read fresh), size-checked,
fetched once under a lock, evicted least-recently-used beyond its budget."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sample_data.generate import decode_index
from shardkit import LoaderError, ShardLoader, transforms
from shardkit.index.manifest import ShardEntry
from shardkit.loader.read.cache import ShardCache
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store


def _epoch(url: str, cache: Path, **kw: Any) -> list[str]:
    loader = ShardLoader(url, batch_size=8, transform=transforms.imagenet_val(32), shuffle=False, keys=True,
                         cache_dir=str(cache), **kw)
    keys = []
    for images, _, batch_keys in loader:
        for image, key in zip(images, batch_keys, strict=True):
            assert decode_index(image) == int(key)  # the pixels are the sample the key names
        keys += batch_keys
    loader.close()
    return keys


def test_repacking_the_same_url_never_reads_stale_cached_bytes(indexed_tree: Path, tmp_path: Path) -> None:
    url, cache = f"memory://shardkit-tests/{uuid.uuid4().hex}/ds", tmp_path / "cache"
    pack(str(indexed_tree), url, options=PackOptions(max_count=10, seed=1), workers=1)
    first = _epoch(url, cache)
    pack(str(indexed_tree), url, options=PackOptions(max_count=10, seed=2), workers=1, overwrite=True)
    second = _epoch(url, cache, num_workers=2)
    assert first != second and set(first) == set(second) == {f"{i:08d}" for i in range(69)}
    assert not list(cache.glob("*.tmp-*"))


def test_eviction_keeps_the_cache_under_its_budget(indexed_tree: Path, tmp_path: Path) -> None:
    url, cache = f"memory://shardkit-tests/{uuid.uuid4().hex}/ds", tmp_path / "cache"
    manifest = pack(str(indexed_tree), url, options=PackOptions(max_count=10, seed=1), workers=1).manifest
    budget = 2 * max(s.num_bytes for s in manifest.shards) + 1
    assert budget < sum(s.num_bytes for s in manifest.shards)
    keys = _epoch(url, cache, cache_bytes=budget)
    assert set(keys) == {f"{i:08d}" for i in range(69)}
    files = list(cache.glob("*.tar"))
    assert 0 < sum(f.stat().st_size for f in files) <= budget
    assert {f.stem for f in files} <= {s.sha256 for s in manifest.shards}


class _SlowStore:
    """A store whose reads take a while and are counted (widens the fetch race on purpose)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.reads = data, 0

    def open_read(self, name: str) -> io.BytesIO:
        self.reads += 1
        time.sleep(0.05)
        return io.BytesIO(self.data)

    def path(self, name: str) -> str:
        return f"memory://x/{name}"


def test_concurrent_openers_fetch_once_and_a_wrong_size_is_refused(tmp_path: Path) -> None:
    store, cache = _SlowStore(b"x" * 1000), ShardCache(str(tmp_path / "c"))
    entry = ShardEntry(url="s.tar", num_samples=1, num_bytes=1000, sha256=hashlib.sha256(b"x" * 1000).hexdigest())
    fds: list[int] = []
    threads = [threading.Thread(target=lambda: fds.append(cache.open(store, entry))) for _ in range(4)]  # type: ignore[arg-type]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.reads == 1 and len(fds) == 4
    bad = ShardEntry(url="t.tar", num_samples=1, num_bytes=999, sha256="cd" * 32)
    with pytest.raises(LoaderError, match="999"):
        cache.open(store, bad)  # type: ignore[arg-type]
    assert not Path(cache.path(bad)).exists()
    with pytest.raises(LoaderError):
        ShardCache(str(tmp_path), 0)


def test_a_fetched_shard_whose_hash_differs_is_refused_and_not_cached(indexed_tree: Path, tmp_path: Path) -> None:
    """A remote shard damaged where no sample is read (its end-of-archive block) used to be
    cached and streamed silently; its sha256 is now checked as it is fetched."""
    import fsspec

    url, cache = f"memory://shardkit-tests/{uuid.uuid4().hex}/ds", tmp_path / "cache"
    manifest = pack(str(indexed_tree), url, options=PackOptions(max_count=40, seed=1), workers=1).manifest
    shard = manifest.shards[1]
    fs = fsspec.filesystem("memory")
    data = bytearray(fs.cat(f"{url}/{shard.url}"))
    data[-3] ^= 0x10
    fs.pipe(f"{url}/{shard.url}", bytes(data))
    want = f"fetched bytes have sha256 [0-9a-f]{{64}}, index.json says {shard.sha256}"
    with pytest.raises(LoaderError, match=want) as err:
        _epoch(url, cache)
    assert shard.url in err.value.where
    assert {f.name for f in cache.iterdir() if f.suffix == ".tar"} == {manifest.shards[0].sha256 + ".tar"}


def test_a_loader_leaves_no_lock_files_in_the_cache(indexed_tree: Path, tmp_path: Path) -> None:
    """One ``<sha256>.tar.lock`` per shard ever cached used to stay in ``cache_dir``."""
    url, cache = f"memory://shardkit-tests/{uuid.uuid4().hex}/ds", tmp_path / "cache"
    manifest = pack(str(indexed_tree), url, options=PackOptions(max_count=10, seed=1), workers=1).manifest
    assert set(_epoch(url, cache, num_workers=2)) == {f"{i:08d}" for i in range(69)}
    table = json.loads(Store(url).read_bytes("index.json"))["table"]["sha256"]
    assert {f.name for f in cache.iterdir()} == {f"{s.sha256}.tar" for s in manifest.shards} | {f"{table}.table"}
    budget = 2 * max(s.num_bytes for s in manifest.shards) + 1  # evicts while reading
    assert set(_epoch(url, tmp_path / "small", cache_bytes=budget)) == {f"{i:08d}" for i in range(69)}
    left = [f.name for f in (tmp_path / "small").iterdir()]
    assert left and all(name.endswith((".tar", ".table")) for name in left), left


class _CountingFileStore:
    """Reads a real file, slowly, and appends a line to ``log`` per read (counts across processes)."""

    def __init__(self, source: Path, log: Path) -> None:
        self.source, self.log = source, log

    def open_read(self, name: str) -> io.BytesIO:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.2)  # the others open the lock file and wait on it meanwhile
        return io.BytesIO(self.source.read_bytes())

    def path(self, name: str) -> str:
        return str(self.source)


def _open_and_read(store: _CountingFileStore, entry: ShardEntry, directory: str, out: Any) -> None:
    fd = ShardCache(directory).open(store, entry)  # type: ignore[arg-type]
    with os.fdopen(fd, "rb") as f:
        out.put(hashlib.sha256(f.read()).hexdigest())


@pytest.mark.timeout(120)
def test_processes_fetch_a_shard_once_and_leave_no_lock_file(tmp_path: Path) -> None:
    """Lock files are unlinked while held; processes that waited on an unlinked one retry on the
    current one, so the shard is still fetched once."""
    ctx = multiprocessing.get_context("fork")
    cache = tmp_path / "cache"
    for round_ in range(3):
        data = os.urandom(100_000 + round_)
        source, log = tmp_path / f"s{round_}.tar", tmp_path / f"reads{round_}"
        source.write_bytes(data)
        log.touch()
        entry = ShardEntry(url=source.name, num_samples=1, num_bytes=len(data),
                           sha256=hashlib.sha256(data).hexdigest())
        out = ctx.Queue()
        procs = [ctx.Process(target=_open_and_read, args=(_CountingFileStore(source, log), entry, str(cache), out))
                 for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 4
        assert [out.get(timeout=10) for _ in procs] == [entry.sha256] * 4
        assert len(log.read_text().splitlines()) == 1  # fetched once
        assert not list(cache.glob("*.lock")), sorted(f.name for f in cache.iterdir())
