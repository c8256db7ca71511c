"""Batch augmentations on a loader batch: ``transforms.ColorJitter`` and ``transforms.RandomErasing``
on a whole uint8 ``[B, 3, S, S]`` batch against torchvision's ``v2`` transforms applied image by
image (what a per-sample pipeline does), on one device.

Each row is the median of ``--repeats`` timed calls after two warm-up calls, in milliseconds per
batch and images per second (CUDA: synchronised around each call)::

    python -m benchmarks.bench_augment --device cpu --batch 256 --size 224 --threads 2
    python -m benchmarks.bench_augment --device cuda --batch 256 --size 224
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torchvision.transforms import v2

from shardkit.transforms import ColorJitter, RandomErasing

JITTER = dict(brightness=0.4, contrast=0.4, saturation=0.4)


def _time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after two warm-up runs."""
    runs = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=device)
    generator = torch.Generator().manual_seed(0)
    jitter, erase = ColorJitter(**JITTER), RandomErasing(p=0.25)
    tv_jitter, tv_erase = v2.ColorJitter(**JITTER), v2.RandomErasing(p=0.25)
    cases: dict[str, Callable[[], object]] = {
        "ColorJitter (shardkit, batch)": lambda: jitter(batch, generator),
        "ColorJitter (torchvision, per image)": lambda: torch.stack([tv_jitter(img) for img in batch]),
        "RandomErasing (shardkit, batch)": lambda: erase(batch, generator),
        "RandomErasing (torchvision, per image)": lambda: torch.stack([tv_erase(img) for img in batch]),
    }
    rows = []
    for name, fn in cases.items():
        seconds = _time(fn, device, args.repeats)
        rows.append({"case": name, "ms_per_batch": round(seconds * 1e3, 2), "img_per_s": round(args.batch / seconds)})
        print(f"{name:42s} {seconds * 1e3:9.2f} ms/batch {args.batch / seconds:10.0f} img/s", flush=True)
    print(json.dumps({"device": str(device), "batch": args.batch, "size": args.size,
                      "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
