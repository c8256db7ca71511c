"""Start-up: time from ``ShardLoader(...)`` to the first batch for an ImageNet-sized manifest.

Builds a dataset of ``--shards`` shard entries of ``--per-shard`` samples each (1,300 x 1,000 =
1.3 M samples by default) whose shard files are hard links to one real packed shard of tiny
images, so the manifest, epoch plan and partition have ImageNet's size while the disk stays
small. Nothing is listed or scanned: the loader reads index.json and the offsets of the shards
the first batch touches.

    python -m benchmarks.bench_startup --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from sample_data.generate import make_indexed_imagefolder
from shardkit import ShardLoader, transforms
from shardkit.pack import PackOptions, pack


def build(root: Path, shards: int, per_shard: int) -> Path:
    src, one = root / "src", root / "one"
    make_indexed_imagefolder(src, classes=4, per_class=per_shard // 4, size=(32, 24))
    pack(str(src), str(one), options=PackOptions(max_count=per_shard), workers=1)
    manifest = json.loads((one / "index.json").read_text())
    entry = manifest["shards"][0]
    ds = root / "ds"
    ds.mkdir()
    entries = []
    for i in range(shards):
        name = f"shard-{i:06d}"
        os.link(one / entry["url"], ds / f"{name}.tar")
        os.link(one / "shard-000000.idx", ds / f"{name}.idx")
        entries.append({**entry, "url": f"{name}.tar"})
    manifest.update(shards=entries, num_samples=entry["num_samples"] * shards)
    (ds / "index.json").write_text(json.dumps(manifest))
    return ds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=1300)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ds = build(Path(tmp), args.shards, args.per_shard)
        size = json.loads((ds / "index.json").read_text())["num_samples"]
        for _ in range(args.repeats):
            started = time.perf_counter()
            with ShardLoader(str(ds), batch_size=args.batch_size,
                             transform=transforms.imagenet_train(224),
                             num_workers=args.workers) as loader:
                built = time.perf_counter()
                next(iter(loader))
                first = time.perf_counter()
            print(f"{size:,} samples in {args.shards} shards: constructor {built - started:.2f} s, "
                  f"first batch of {args.batch_size} after {first - started:.2f} s ({args.workers} "
                  "workers)",
                  flush=True)


if __name__ == "__main__":
    main()
