"""ShardLoader from S3 (a moto server on 127.0.0.1) against the same shards on local disk.

Each S3 run starts with an empty shard cache (so every shard is fetched once per run, as on a
fresh node); runs alternate local/S3; images/s over whole epochs after a warm-up batch.

    python -m benchmarks.bench_remote /tmp/skbench/shards --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import shutil
import socket
import statistics
import tempfile
import time
from typing import Any

from shardkit import ShardLoader, transforms


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rate(url: str, args: argparse.Namespace, **extra: Any) -> float:
    with ShardLoader(url, batch_size=args.batch_size, transform=transforms.imagenet_train(224),
                     num_workers=args.workers, drop_last=True, **extra) as loader:
        it = iter(loader)
        next(it)  # warm-up: worker start
        started, n = time.perf_counter(), 0
        for _, labels in it:
            n += len(labels)
        return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_remote", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="a packed dataset on local disk")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, "key": "k",
               "secret": "s"}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("bench")
    fs.put(args.shards.rstrip("/") + "/", "bench/ds/", recursive=True)
    rates: dict[str, list[float]] = {"local": [], "s3": []}
    try:
        for rep in range(args.repeats):
            for where in (("local", "s3") if rep % 2 == 0 else ("s3", "local")):
                if where == "local":
                    rates[where].append(_rate(args.shards, args))
                else:
                    cache = tempfile.mkdtemp(prefix="shardkit-cache-")
                    try:
                        rates[where].append(_rate("s3://bench/ds", args, storage_options=options,
                                                  cache_dir=cache))
                    finally:
                        shutil.rmtree(cache)
                print(f"rep {rep + 1} {where:5s} {rates[where][-1]:8.0f} img/s", flush=True)
    finally:
        server.stop()
    local, remote = statistics.median(rates["local"]), statistics.median(rates["s3"])
    print(f"local median {local:.0f} img/s, s3 (cold cache each run) median {remote:.0f} img/s, "
          f"ratio {remote / local:.2f}")


if __name__ == "__main__":
    main()
