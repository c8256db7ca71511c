"""Packing from S3 (a moto server on 127.0.0.1): what the bounded read window buys, and the whole
pack against the same tree on local disk.

1. Reads: ``RemoteFiles.read_each`` over every sample, in one process, with ``READ_THREADS``
   objects in flight (the default) against one at a time, with a round-trip delay added to each
   GET (an ``asyncio.sleep`` before s3fs's request: real sockets and moto otherwise; moto on
   loopback answers in a few ms, a real object store in tens).
2. Pack: ``pack(SRC, local DST, workers=N)`` from S3 and from disk, alternating; same output
   bytes (checked).

Not a test: run it by hand and record the numbers in docs/performance.md.

    python -m benchmarks.bench_remote_source sample_data/imagefolder --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def _read_rate(url: str, options: dict[str, Any], threads: int) -> float:
    import shardkit.sources.remote as remote
    from shardkit.sources import scan_imagefolder

    listing = scan_imagefolder(url, storage_options=options)
    remote.READ_THREADS = threads
    started = time.perf_counter()
    n = sum(1 for _ in listing.files.read_each(listing.samples))
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_remote_source", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="an ImageFolder tree on local disk")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-count", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delays-ms", default="0,20,50",
                        help="round-trip delays added to each GET in part 1")
    args = parser.parse_args()

    import s3fs

    from shardkit.pack import PackOptions, pack
    from shardkit.sources.remote import READ_THREADS
    from tests.conftest import upload_tree

    # moto in a process of its own: in this one its request handling would share the GIL with
    # the reader threads being measured
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    # skip_instance_cache: a fresh filesystem picks up the delayed GET below
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, "key": "k",
               "secret": "s", "skip_instance_cache": True}
    s3fs.S3FileSystem(**options).mkdir("bench")
    url = "s3://bench/train"
    upload_tree(args.src, url, options)

    real_cat = s3fs.S3FileSystem._cat_file
    for delay in (float(d) / 1000 for d in args.delays_ms.split(",")):
        async def slow_cat(self: Any, *a: Any, _delay: float = delay, **k: Any) -> Any:
            await asyncio.sleep(_delay)
            return await real_cat(self, *a, **k)

        s3fs.S3FileSystem._cat_file = slow_cat
        for threads in (1, READ_THREADS):
            reads = [_read_rate(url, options, threads) for _ in range(args.repeats)]
            print(f"reads   +{delay * 1000:3.0f} ms/GET  {threads} in flight  "
                  f"{statistics.median(reads):7.0f} img/s  (runs: {', '.join(f'{r:.0f}' for r in reads)})")
    s3fs.S3FileSystem._cat_file = real_cat

    options_ = PackOptions(max_count=args.max_count)
    tmp = Path(tempfile.mkdtemp(prefix="skbench-src-"))
    rates: dict[str, list[float]] = {"disk": [], "s3": []}
    outputs: dict[str, dict[str, str]] = {}
    try:
        for _ in range(args.repeats):
            for where, src in (("disk", str(args.src)), ("s3", url)):
                dst = tmp / where
                shutil.rmtree(dst, ignore_errors=True)
                started = time.perf_counter()  # listing included
                result = pack(src, str(dst), options=options_, workers=args.workers,
                              source_options=options)
                rates[where].append(result.manifest.num_samples / (time.perf_counter() - started))
                outputs[where] = _digests(dst)
        assert outputs["disk"] == outputs["s3"], "S3 and disk packs differ"
        for where, rs in rates.items():
            print(f"pack    from {where:4}  workers {args.workers}  {statistics.median(rs):7.0f} img/s  "
                  f"(runs: {', '.join(f'{r:.0f}' for r in rs)}; listing and worker start included)")
        print("outputs byte-identical")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
