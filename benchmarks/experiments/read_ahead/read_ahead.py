"""Read-ahead across epochs on and off (``ShardLoader(read_ahead=...)``), side by side in one run.

1. *Route alone*: for each round, in alternating order, one GPU-route loader per setting delivering
   uint8 RandomResizedCrop + flip batches (as ``benchmarks.experiments.feeders.feeders_alone``), one untimed warm-up
   epoch, then ``--epochs`` epochs timed as one span (synchronised at both ends), the usual
   ``set_epoch`` loop: the epoch boundaries are inside the span, as in training.
   ``--device cpu``: the CPU route, alone only.
2. *Training step* (``--model``): :func:`shardkit.bench.train.run_contenders` with the two settings
   as contenders (alternating, a fresh loader per run), as ``shardkit bench --train`` measures.

Prints every run and, per setting, the median (min-max); for training also the per-repetition
ratio of fed rates. Run (repository root, a CUDA machine)::

    python -m benchmarks.experiments.read_ahead.read_ahead /tmp/inet /tmp/shards --model resnet18 --size 176 \\
        --workers 16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from shardkit import ShardLoader, transforms
from shardkit.bench import conditions
from shardkit.bench.harness import alternating_order
from shardkit.bench.train import TrainRun, TrainStep, run_contenders

SETTINGS = {"read-ahead": True, "epoch by epoch": False}


def alone_rate(shards: str, *, read_ahead: bool, workers: int, feeders: int | str, size: int, epochs: int,
               device: str = "cuda", batch_size: int = 128) -> float:
    """Images/s over ``epochs`` epochs after a warm-up one, on one loader."""
    with ShardLoader(shards, batch_size=batch_size, transform=transforms.imagenet_train(size), num_workers=workers,
                     device=device, drop_last=True, feeders=feeders, read_ahead=read_ahead) as loader:
        loader.wait_for_feeders()  # feeders="auto": started now, not behind the warm-up epoch
        for _batch in loader:
            pass
        sync = torch.cuda.synchronize if loader.device.type == "cuda" else (lambda: None)
        sync()
        t0, images = time.perf_counter(), 0
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            for batch, _labels in loader:
                images += batch.shape[0]
        sync()
        return images / (time.perf_counter() - t0)


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.experiments.read_ahead.read_ahead",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("imagefolder")
    ap.add_argument("shards")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the CPU route, alone only")
    ap.add_argument("--batch-size", type=int, default=128, help="of the route-alone part")
    ap.add_argument("--feeders", default="auto")
    ap.add_argument("--alone-size", type=int, default=224)
    ap.add_argument("--alone-epochs", type=int, default=8)
    ap.add_argument("--alone-rounds", type=int, default=2, help="0: no route-alone part")
    ap.add_argument("--model", choices=("resnet18", "resnet50", "none"), default="resnet18")
    ap.add_argument("--size", type=int, default=176)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    feeders: int | str = args.feeders if args.feeders == "auto" else int(args.feeders)

    alone: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for rnd, names in enumerate(alternating_order(list(SETTINGS), args.alone_rounds)):
        for name in names:
            rate = alone_rate(args.shards, read_ahead=SETTINGS[name], workers=args.workers, feeders=feeders,
                              size=args.alone_size, epochs=args.alone_epochs, device=args.device,
                              batch_size=args.batch_size)
            alone[name].append(rate)
            print(f"alone {name} round {rnd}: {rate:,.0f} img/s", flush=True)
    for name, rates in alone.items():
        if rates:
            print(f"alone {name}: {spread(rates)} img/s over {len(rates)} runs of {args.alone_epochs} epochs")
    if args.model == "none" or args.device == "cpu":
        return

    device = torch.device("cuda")
    step = TrainStep(args.model, conditions.describe_imagefolder(args.imagefolder)["classes"], device)
    bf16 = transforms.imagenet_train(args.size, normalize=True, dtype=torch.bfloat16, channels_last=True)

    def build(read_ahead: bool) -> Callable[[], ShardLoader]:
        return lambda: ShardLoader(args.shards, batch_size=128, transform=bf16, num_workers=args.workers,
                                   device="cuda", drop_last=True, feeders=feeders, read_ahead=read_ahead)

    def report(name: str, rep: int, run: TrainRun) -> None:
        print(f"train {name} run {rep}: fed {run.fed_images_per_second:,.0f}, synthetic "
              f"{run.synthetic_images_per_second:,.0f}, share {run.share:.0%}, host wait {run.host_wait_fraction:.1%}",
              flush=True)

    runs = run_contenders({name: (step, build(on)) for name, on in SETTINGS.items()}, steps=args.steps,
                          warmup=args.warmup, batch_size=128, repeats=args.repeats, after_run=report)
    print(f"training step {args.model} @{args.size}, batch 128, {args.workers} workers, feeders {args.feeders}, "
          f"{args.steps} timed steps x {args.repeats} runs")
    for name, rs in runs.items():
        print(f"  {name:15s} fed {spread([r.fed_images_per_second for r in rs])}  "
              f"synthetic {spread([r.synthetic_images_per_second for r in rs])}  "
              f"share {spread([r.share for r in rs], '{:.0%}')}  "
              f"host wait {spread([r.host_wait_fraction for r in rs], '{:.1%}')}")
    on, off = runs["read-ahead"], runs["epoch by epoch"]
    ratios = [a.fed_images_per_second / b.fed_images_per_second for a, b in zip(on, off, strict=True)]
    print(f"  fed ratio read-ahead / epoch by epoch, per repetition: {spread(ratios, '{:.2f}x')}")


if __name__ == "__main__":
    main()
