"""Start-up at scale: seconds from ``ShardLoader(...)`` to its first batch, manifest read included,
for datasets of ``--shards`` shard entries, on local disk and from S3 (a moto server on 127.0.0.1,
in a process of its own), with the shard table (``index.table``, ``index.hashes``) and without
it (``index.json`` alone, as datasets written before the table existed).

Every shard entry has ``--per-shard`` samples and names a hard link to one of a few copies of
one real packed shard of tiny images (ext4 allows 65,000 links per file), with a random size and
sha256 as a real dataset's, so the manifest, its table and the epoch plan have the full size
while the disk stays small; the shards the first batches read are real, each its own padded copy
(own size and sha256, see :func:`build`). On S3 only ``index.json``, the table and the shards the
first batches read are uploaded. Each S3 run starts
with an empty node cache (``cold``: the first rank of a node fetches the table) or with the
table already in it, fetched by another process (``warm``: the node's other ranks). A run with ``num_workers=0``
counts the manifest bytes read (``index.json``, ``index.table``, ``index.hashes``) up to the
first batch.

    python -m benchmarks.bench_manifest --shards 10000,100000,500000 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from sample_data.generate import make_indexed_imagefolder
from shardkit import ShardLoader, transforms
from shardkit.index.manifest import Manifest
from shardkit.index.manifest_io import read_manifest, write_manifest
from shardkit.index.shards import NamedShards, ShardTable
from shardkit.loader.epochs.config import PlanConfig
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store

_LINKS_PER_COPY = 60_000
_MANIFEST_FILES = ("index.json", "index.table", "index.hashes")


def first_shards(counts: np.ndarray, batch_size: int, batches: int = 8) -> list[int]:
    """The shards rank 0's first ``batches`` batches read, with the loader's defaults (seed 0,
    shuffle, window 8, one rank): the plan depends on the sample counts alone."""
    config = PlanConfig(shard_sizes=counts, seed=0, shuffle=True, window=8, rank=0, world_size=1,
                        batch_size=batch_size, drop_last=False, even_batches=False)
    order = config.order(0)
    return sorted({int(s) for b in range(min(batches, config.num_batches)) for s in config.batch(order, b)[0]})


def build(root: Path, shards: int, per_shard: int, batch_size: int) -> tuple[Path, list[int]]:
    """``root/ds``: ``shards`` entries, with its table, and the shards the first batches read;
    ``index.plain.json`` beside it is the same manifest without the table's reference.

    The shards the first batches read are copies of one real shard, each padded with its own
    number of zero records (a valid tar still, with its own size and sha256); every other entry
    names a hard link to an unpadded copy and has a random size (larger than the file) and
    sha256, as a real dataset's, so the table and hash columns compress as much as a real one's."""
    src, one = root / "src", root / "one"
    make_indexed_imagefolder(src, classes=4, per_class=per_shard // 4, size=(32, 24))
    packed = pack(str(src), str(one), options=PackOptions(max_count=per_shard), workers=1).manifest
    entry = packed.shards[0]
    data = (one / entry.url).read_bytes()
    ds = root / "ds"
    ds.mkdir()
    counts = np.full(shards, entry.num_samples, np.int64)
    needed = first_shards(counts, batch_size)
    rng = np.random.default_rng(0)
    sizes = entry.num_bytes + rng.integers(0, 10**9, shards) // 512 * 512
    hashes = bytearray(rng.bytes(32 * shards))
    for c in range(-(-shards // _LINKS_PER_COPY)):
        for suffix in (".tar", ".idx"):
            shutil.copyfile(one / f"shard-000000{suffix}", ds / f".copy{c}{suffix}")
    wanted = set(needed)
    for i in range(shards):
        c = i // _LINKS_PER_COPY
        if i in wanted:
            padded = data + bytes(10240 * (1 + needed.index(i)))
            (ds / f"shard-{i:06d}.tar").write_bytes(padded)
            sizes[i] = len(padded)
            hashes[32 * i:32 * i + 32] = hashlib.sha256(padded).digest()
        else:
            os.link(ds / f".copy{c}.tar", ds / f"shard-{i:06d}.tar")
        os.link(ds / f".copy{c}.idx", ds / f"shard-{i:06d}.idx")
    table = ShardTable(NamedShards("shard", shards), counts, sizes.astype(np.int64), bytes(hashes))
    manifest = Manifest(kind="imagefolder", shards=table, classes=packed.classes, options=packed.options,
                        created_by=packed.created_by)
    write_manifest(Store(str(ds)), manifest)
    (root / "index.plain.json").write_bytes(manifest.to_json())
    return ds, needed


def _use(ds: Path, root: Path, table: bool) -> None:
    """Put the index.json with (``table``) or without the table's reference in place."""
    name = "index.table.json" if table else "index.plain.json"
    if not (root / "index.table.json").exists():
        shutil.copyfile(ds / "index.json", root / "index.table.json")
    shutil.copyfile(root / name, ds / "index.json")


def first_batch(url: str, args: argparse.Namespace, cache: str, workers: int,
                options: dict[str, Any] | None = None) -> float:
    started = time.perf_counter()
    with ShardLoader(url, batch_size=args.batch_size, transform=transforms.imagenet_train(224),
                     num_workers=workers, cache_dir=cache, storage_options=options) as loader:
        next(iter(loader))
        return time.perf_counter() - started


class _Counted:
    """Count the manifest bytes this process reads through ``Store`` (patched while in use)."""

    def __enter__(self) -> Counter[str]:
        self.bytes: Counter[str] = Counter()
        self.saved = Store.read_bytes, Store.read_range
        read_bytes, read_range = self.saved
        counts = self.bytes

        def counted_bytes(store: Store, name: str, *, limit: int | None = None) -> bytes:
            data = read_bytes(store, name, limit=limit)
            if name in _MANIFEST_FILES:
                counts[name] += len(data)
            return data

        def counted_range(store: Store, name: str, offset: int, length: int) -> bytes:
            data = read_range(store, name, offset, length)
            if name in _MANIFEST_FILES:
                counts[name] += len(data)
            return data

        Store.read_bytes, Store.read_range = counted_bytes, counted_range  # type: ignore[method-assign,assignment]
        return counts

    def __exit__(self, *exc: object) -> None:
        Store.read_bytes, Store.read_range = self.saved  # type: ignore[method-assign]


def _moto(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("moto server did not start")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _upload(ds: Path, root: Path, url: str, options: dict[str, Any], needed: list[int]) -> None:
    """The manifest files and the shards the first batches of rank 0 read."""
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    _use(ds, root, table=True)
    for name in ("index.table", "index.hashes"):
        fs.put_file(str(ds / name), f"{url}/{name}")
    fs.put_file(str(root / "index.table.json"), f"{url}/index.json")
    fs.put_file(str(root / "index.plain.json"), f"{url}/index.plain.json")
    for i in sorted(needed):
        for suffix in (".tar", ".idx"):
            fs.put_file(str(ds / f"shard-{i:06d}{suffix}"), f"{url}/shard-{i:06d}{suffix}")


def _read_elsewhere(url: str, options: dict[str, Any], cache: str) -> None:
    """Read the manifest in another process, as another rank of the node does."""
    code = ("import json, sys; from shardkit.index.manifest_io import read_manifest; "
            "from shardkit.storage import Store; "
            "read_manifest(Store(sys.argv[1], json.loads(sys.argv[2])), cache_dir=sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, url, json.dumps(options), cache], check=True)


def _summary(times: list[float]) -> str:
    return (f"median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}, "
            f"{len(times)} runs)")


def run(shards: int, args: argparse.Namespace, options: dict[str, Any] | None) -> dict[str, Any]:
    result: dict[str, Any] = {"shards": shards}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(args.keep) / f"n{shards}" if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        ds, needed = build(root, shards, args.per_shard, args.batch_size)
        sizes = {name: os.path.getsize(ds / name) for name in _MANIFEST_FILES}
        result["files"] = sizes
        print(f"{shards:,} shards: built in {time.perf_counter() - started:.0f} s; "
              + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sizes.items()), flush=True)
        t = time.perf_counter()
        read_manifest(Store(str(ds)))
        result["read_table_s"] = time.perf_counter() - t
        t = time.perf_counter()
        read_manifest(Store(str(ds)), table=False)
        result["read_json_s"] = time.perf_counter() - t
        print(f"  read_manifest alone: table {result['read_table_s']:.3f} s, index.json {result['read_json_s']:.3f} s",
              flush=True)
        for table in (True, False):
            label = "local " + ("table" if table else "index.json")
            _use(ds, root, table)
            times = [first_batch(str(ds), args, str(root / f"cache-l{r}"), args.workers) for r in range(args.repeats)]
            result[label] = times
            print(f"  {label}: constructor to first batch {_summary(times)}", flush=True)
        _use(ds, root, True)
        if options is None:
            return result
        url = f"s3://bench/ds{shards}"
        _upload(ds, root, url, options, needed)
        for table in (True, False):
            if not table:
                import s3fs

                s3fs.S3FileSystem(**options).copy(f"{url}/index.plain.json", f"{url}/index.json")
            kinds = ("cold", "warm") if table else ("cold",)
            for kind in kinds:
                label = f"s3 {'table' if table else 'index.json'} {kind}"
                times = []
                for r in range(args.repeats):
                    cache = str(root / f"cache-{label.replace(' ', '-')}-{r}")
                    if kind == "warm":  # the node's table already fetched by another rank (another process)
                        _read_elsewhere(url, options, cache)
                    times.append(first_batch(url, args, cache, args.workers, options))
                result[label] = times
                print(f"  {label}: constructor to first batch {_summary(times)}", flush=True)
            with _Counted() as counts:
                first_batch(url, args, str(root / f"cache-count-{table}"), 0, options)
            label = f"s3 {'table' if table else 'index.json'} bytes"
            result[label] = dict(counts)
            print(f"  {label} read up to the first batch (num_workers=0): "
                  + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) + f"; total {sum(counts.values()):,}",
                  flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_manifest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="10000,100000,500000", help="comma-separated shard counts")
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true", help="local runs only")
    parser.add_argument("--tmp", default=None, help="where the datasets are built (default: the temporary directory)")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    parser.add_argument("--keep", default=None, help="build the datasets under KEEP/n<shards> and keep them "
                        "(KEEP/n<shards>/ds, with index.plain.json beside it: the same manifest without the table)")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server, options = None, None
    if not args.no_s3:
        port = _free_port()
        server = _moto(port)
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, "key": "k", "secret": "s"}
        import s3fs

        s3fs.S3FileSystem(**options).mkdir("bench")
    try:
        results = [run(int(n), args, options) for n in args.shards.split(",")]
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
