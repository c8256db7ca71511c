"""How long the training loop's host takes to launch one step, on batches already on the device
and fed by ShardLoader: whether a loader slows the step through the host (GIL, cores) or the GPU.

A compiled step is *device-bound* while the host launches its kernels faster than the GPU runs
them; the host then runs ahead and a loader's host work costs the step nothing. Once the time
to launch a step (the host time inside the step's call) reaches its GPU time, every
millisecond the loader's threads take from the training thread (the GIL, a core) is a
millisecond of the step's wall time. This script times, in one process and in alternating
rounds, the step on one fixed batch (*synthetic*) and fed by ShardLoader at each ``--workers``
count: wall time per step, host time inside the step's call (*launch*), time in ``next``
(*wait*), and the GPU time of the step alone (CUDA events around a synchronised step).
``--switch-intervals`` repeats each fed row under other values of ``sys.setswitchinterval``
(how long a thread that wants the GIL waits before it asks the holder to drop it; Python's
default is 5 ms), set while that row's loader runs.

Usage (from the repository root)::

    python -m benchmarks.experiments.gil.host_launch /tmp/shards --model resnet50 --size 224 \\
        --workers 16,8 --feeders 0
    python -m benchmarks.experiments.gil.host_launch /tmp/shards --model resnet18 --size 176 \\
        --workers 16 --feeders 0,3,4 --switch-intervals 0.0005 --steps 150 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.experiments.gil.profile_gil import forever
from shardkit import ShardLoader, transforms
from shardkit.bench.train import TrainStep


def timed(step: TrainStep, batches: Iterator[Any], n: int) -> tuple[float, float, float]:
    """Wall, launch and wait milliseconds per step over ``n`` steps (synchronised at both ends)."""
    step.sync()
    launch = wait = 0.0
    t0 = time.perf_counter()
    for _ in range(n):
        w = time.perf_counter()
        images, labels = next(batches)
        s = time.perf_counter()
        step(images, labels)
        launch += time.perf_counter() - s
        wait += s - w
    step.sync()
    wall = time.perf_counter() - t0
    return 1e3 * wall / n, 1e3 * launch / n, 1e3 * wait / n


def device_ms(step: TrainStep, batch: tuple[torch.Tensor, torch.Tensor], n: int = 10) -> float:
    """GPU time of one step with the host waiting between steps (nothing queued behind it)."""
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        step.sync()
        a.record()
        step(*batch)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments.gil.host_launch",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="a packed ImageFolder dataset")
    parser.add_argument("--model", default="resnet50", choices=["resnet18", "resnet50"])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", default="16,8", help="worker counts, comma-separated")
    parser.add_argument("--feeders", default="0", help="auto or counts, comma-separated: each a fed row")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--switch-intervals", default="",
                        help="seconds, comma-separated: each fed row again under each (e.g. 0.0005,0.0001)")
    args = parser.parse_args(argv)
    default_interval = sys.getswitchinterval()
    intervals = [default_interval] + [x for x in map(float, filter(None, args.switch_intervals.split(",")))
                                      if x != default_interval]
    device = torch.device("cuda")
    step = TrainStep(args.model, 1000, device)
    transform = transforms.imagenet_train(args.size, normalize=True, dtype=torch.bfloat16, channels_last=True)
    feeder_counts: list[int | str] = [f if f == "auto" else int(f) for f in args.feeders.split(",")]
    counts = [int(w) for w in args.workers.split(",")]

    def loader_of(workers: int, feeders: int | str) -> ShardLoader:
        loader = ShardLoader(args.shards, batch_size=args.batch_size, transform=transform, num_workers=workers,
                             device=device, drop_last=True, feeders=feeders)
        loader.wait_for_feeders()
        return loader

    first = loader_of(counts[0], feeder_counts[0])  # the fixed batch: the loader's own first one
    fixed = step.clone(step.to_device(next(iter(first))))
    first.close()

    def repeat() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield fixed

    def label(workers: int, feeders: int | str, interval: float) -> str:
        return (f"fed, {workers} workers" + ("" if len(feeder_counts) == 1 else f", {feeders} feeders")
                + ("" if interval == default_interval else f", {interval * 1e3:g} ms"))

    fed_rows = {label(w, f, i): (w, f, i) for w in counts for f in feeder_counts for i in intervals}
    rows: dict[str, list[tuple[float, float, float]]] = {"synthetic": [], **{name: [] for name in fed_rows}}
    for r in range(args.rounds):
        for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            if name == "synthetic":
                timed(step, repeat(), args.steps // 3)
                rows[name].append(timed(step, repeat(), args.steps))
                continue
            workers, feeders, interval = fed_rows[name]
            sys.setswitchinterval(interval)
            try:
                loader = loader_of(workers, feeders)
                fed = map(step.to_device, forever(loader))
                timed(step, fed, args.steps + 12)  # the lead-in: compiles, drains what the loader buffered
                while not loader.settled:
                    timed(step, fed, 1)
                rows[name].append(timed(step, fed, args.steps))
                loader.close()
            finally:
                sys.setswitchinterval(default_interval)
    print(f"{args.model} @{args.size}, batch {args.batch_size}, feeders {args.feeders}, "
          f"{torch.cuda.get_device_name(0)}; the step alone on the device: {device_ms(step, fixed):.1f} ms")
    print(f"{'':<36} {'wall ms':>16} {'launch ms':>16} {'wait ms':>14} {'img/s':>8}")
    for name, runs in rows.items():
        cols = []
        for i in range(3):
            values = [run[i] for run in runs]
            cols.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        rate = args.batch_size * 1e3 / statistics.median(run[0] for run in runs)
        print(f"{name:<36} {cols[0]:>16} {cols[1]:>16} {cols[2]:>14} {rate:8,.0f}")

if __name__ == "__main__":
    main()
