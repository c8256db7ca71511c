"""Pack throughput: shardkit ``pack(workers=N)`` vs webdataset ``ShardWriter`` in one process.

Both write the same samples (original JPEG bytes + ``cls`` + ``json``) with the same samples per
shard, to local disk, on a warm page cache; shardkit's time includes its sha256 of every shard,
its offsets files and ``index.json``. Runs alternate (wds, shardkit, wds, …) so drift in the
machine's speed hits both. Not a test: run it by hand and record the numbers in docs/performance.md.

    python -m benchmarks.bench_pack --classes 10 --per-class 300 --max-count 100 --workers 2 \\
        --repeats 3

``--ray`` adds a row: the same pack with ``executor="ray"`` on a local Ray cluster of ``--workers``
CPUs, started once before the runs (its start-up is printed, not counted in the rates). Its CPU
column counts the driver only: Ray's workers are not children this process reaps.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _tree(root: Path, classes: int, per_class: int) -> Path:
    from sample_data.generate import make_imagenet_like

    marker = root / f".done-{classes}x{per_class}"
    if not marker.exists():
        make_imagenet_like(root, classes=classes, per_class=per_class, seed=0,
                           workers=os.cpu_count() or 1)
        marker.touch()
    return root


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children (pack workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _warm(src: Path) -> int:
    total = 0
    for path in src.rglob("*"):
        if path.is_file():
            total += len(path.read_bytes())
    return total


def run_webdataset(src: Path, dst: Path, max_count: int) -> tuple[int, float]:
    """The one-process baseline: the usual ShardWriter loop over an ImageFolder listing."""
    import webdataset as wds
    from PIL import Image

    from shardkit.sources import scan_imagefolder

    started = time.perf_counter()
    listing = scan_imagefolder(str(src))
    dst.mkdir(parents=True)
    count = 0
    with wds.ShardWriter(str(dst / "shard-%06d.tar"), maxcount=max_count, verbose=0) as sink:
        for i, s in enumerate(listing.samples):
            data = Path(s.path).read_bytes()
            with Image.open(s.path) as img:  # width/height for the json, like shardkit records
                width, height = img.size
            if listing.classes is None or s.label is None:
                raise SystemExit(f"{s.rel}: not an ImageFolder sample (no class)")
            meta = {"label": s.label, "class": listing.classes[s.label], "source": s.rel,
                    "width": width, "height": height}
            sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": s.label, "json": meta})
            count += 1
    return count, time.perf_counter() - started


def run_shardkit(src: Path, dst: Path, max_count: int, workers: int,
                 ray: bool = False) -> tuple[int, float]:
    from shardkit.pack import PackOptions, pack

    started = time.perf_counter()
    result = pack(str(src), str(dst), options=PackOptions(max_count=max_count, shuffle=False),
                  workers=workers, executor="ray" if ray else "processes")
    return result.manifest.num_samples, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=None,
                        help="ImageFolder tree (default: generate one)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--max-count", type=int, default=100,
                        help="samples per shard (both writers); enough shards to keep every worker "
                             "busy")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray", action="store_true",
                        help="add a row: executor='ray' on a local cluster")
    parser.add_argument("--work-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "shardkit-bench-pack")
    args = parser.parse_args()

    src = args.src or _tree(args.work_dir / "src", args.classes, args.per_class)
    size = _warm(src)
    rates: dict[str, list[float]] = {"webdataset ShardWriter (1 process)": [],
                                     f"shardkit pack (workers={args.workers})": []}
    if args.ray:
        import ray

        started = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        print(f"local Ray cluster of {args.workers} CPUs started in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        rates[f"shardkit pack (ray, {args.workers} CPUs)"] = []
    cpu: dict[str, list[float]] = {name: [] for name in rates}
    names = list(rates)
    for rep in range(args.repeats):
        for name in names:
            dst = args.work_dir / f"out-{rep}-{names.index(name)}"
            shutil.rmtree(dst, ignore_errors=True)
            cpu_before = _cpu_seconds()
            if name.startswith("webdataset"):
                n, seconds = run_webdataset(src, dst, args.max_count)
            else:
                n, seconds = run_shardkit(src, dst, args.max_count, args.workers,
                                          ray="(ray" in name)
            cpu[name].append((_cpu_seconds() - cpu_before) / n * 1000)
            rates[name].append(n / seconds)
            print(f"rep {rep}  {name:40s} {n} images in {seconds:6.2f} s = {n / seconds:8.0f} img/s"
                  f"  ({cpu[name][-1]:.2f} CPU s per 1000 images)", flush=True)
            shutil.rmtree(dst, ignore_errors=True)
    medians = {name: statistics.median(r) for name, r in rates.items()}
    print(f"\n{n} images, {size / n / 1000:.0f} KB each on average, max-count {args.max_count}")
    for name, median in medians.items():
        print(f"{name:40s} median {median:8.0f} img/s   runs: "
              f"{', '.join(f'{r:.0f}' for r in rates[name])}")
    ratio = medians[names[1]] / medians[names[0]]
    cpu_medians = {name: statistics.median(c) for name, c in cpu.items()}
    for name, c in cpu_medians.items():
        print(f"{name:40s} median {c:8.2f} CPU s per 1000 images")
    print(f"ratio shardkit / webdataset: {ratio:.2f}x   (load average now: "
          f"{os.getloadavg()[0]:.1f})")
    for name in names[2:]:
        print(f"ratio {name} / webdataset: {medians[name] / medians[names[0]]:.2f}x")
    print(json.dumps({"images": n, "medians": medians, "ratio": round(ratio, 3),
                      "cpu_per_1000": cpu_medians}))


if __name__ == "__main__":
    main()
