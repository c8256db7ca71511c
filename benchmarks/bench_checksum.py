"""The cost of the per-sample CRC-32 the loader checks on every read (offsets file version 2).

Packs a generated ImageNet-like set (or takes ``--shards``), then reads every sample with the
shard reader, alternately with the dataset's offsets files as written (version 2: each sample's
CRC-32 checked) and rewritten as version 1 (no checksum), ``--repeats`` times each, from the
page cache; prints the median microseconds per sample of each, the difference, and what one
sample costs the CPU route end to end (decode and transform, one process) for scale.

    python -m benchmarks.bench_checksum --repeats 7
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sample_data.generate import make_imagenet_like
from shardkit import ShardLoader, transforms
from shardkit.index.manifest_io import locate_dataset, read_manifest
from shardkit.loader.read.reader import ShardReader
from shardkit.pack import pack


def _read_all(ds: Path) -> float:
    """Seconds per sample to read every sample of ``ds`` once with the shard reader."""
    store = locate_dataset(str(ds))
    shards = read_manifest(store).shards
    reader = ShardReader(store, shards)
    started = time.perf_counter()
    count = 0
    for i, shard in enumerate(shards):
        for j in range(shard.num_samples):
            reader.read(i, j)
            count += 1
    seconds = time.perf_counter() - started
    reader.close()
    return seconds / count


def _as_version_1(src: Path, dst: Path) -> None:
    """A copy of ``src`` whose offsets files have no checksums (shard files hard-linked)."""
    dst.mkdir()
    for path in src.iterdir():
        if path.suffix == ".idx":
            lines = path.read_text().splitlines()
            head = lines[0].split()
            rows = [" ".join(line.split()[:3]) for line in lines[1:]]
            (dst / path.name).write_text("\n".join([f"{head[0]} 1 {head[2]}", *rows]) + "\n")
        else:
            (dst / path.name).hardlink_to(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", default=None, help="a packed dataset [default: pack a generated one]")
    ap.add_argument("--images", type=int, default=2000, help="generated images [default: 2000]")
    ap.add_argument("--repeats", type=int, default=7, help="reads of the whole set per setting [default: 7]")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardkit-checksum-"))
    try:
        if args.shards is None:
            make_imagenet_like(work / "src", classes=10, per_class=args.images // 10, seed=0)
            pack(str(work / "src"), str(work / "v2"), workers=2)
            ds = work / "v2"
        else:
            ds = Path(args.shards)
        _as_version_1(ds, work / "v1")
        times: dict[str, list[float]] = {"crc32 checked (v2)": [], "no checksum (v1)": []}
        _read_all(ds)  # page cache
        for _ in range(args.repeats):  # alternating
            times["crc32 checked (v2)"].append(_read_all(ds))
            times["no checksum (v1)"].append(_read_all(work / "v1"))
        medians = {name: statistics.median(v) * 1e6 for name, v in times.items()}
        for name, us in medians.items():
            print(f"{name:<20} {us:8.1f} µs/sample (median of {args.repeats})")
        manifest = read_manifest(locate_dataset(str(ds)))
        print(f"difference           {medians['crc32 checked (v2)'] - medians['no checksum (v1)']:8.1f} µs/sample "
              f"({manifest.num_bytes / manifest.num_samples / 1e3:.0f} KB a sample)")
        loader = ShardLoader(str(ds), batch_size=64, transform=transforms.imagenet_train(224), num_workers=0)
        started, n = time.perf_counter(), 0
        for images, _labels in loader:
            n += len(images)
        print(f"CPU route, 1 process {1e6 * (time.perf_counter() - started) / n:8.1f} µs/sample (decode, crop, "
              "resize, flip), for scale")
        loader.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
