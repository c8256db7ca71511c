"""Who holds the GIL while ShardLoader feeds a training step: py-spy's ``--gil`` samples, by thread.

A compiled ResNet step at a fast rate is *host-bound* (``shardkit bench --train`` says so when
its GPU time is well under its wall time): its Python and kernel launches set its pace, and
every other Python thread of the process competes with it for the GIL. This script trains on
the loader's batches for ``--warmup`` steps, then lets py-spy sample the process (``--gil``:
only the thread holding the GIL, ``--nonblocking``: without pausing it) for ``--seconds`` while
training goes on, and prints the share of samples per thread group: the training loop's own
thread, autograd's thread (a compiled backward runs there), the loader's threads
(``shardkit-*``) with their heaviest frames, and the rest. It needs py-spy (``pip install
py-spy``) and the right to trace the process (root, or ``ptrace_scope`` 0).

Usage (from the repository root)::

    shardkit pack /tmp/inet /tmp/shards
    python -m benchmarks.experiments.gil.profile_gil /tmp/shards --device cuda --model resnet18 --size 176

Measured with it: this folder's README.md, and the performance history (docs/performance-history.md).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from shardkit import ShardLoader, transforms
from shardkit.bench.train import TrainStep, counted


def forever(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, epoch after epoch (each ``iter()`` is one epoch)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader delivered no batch in an epoch")


def summarise(raw: str, top: int = 8) -> str:
    """py-spy's ``--format raw`` output (``thread (tid): name;frame;frame... count`` per line) as
    shares of the samples per thread group, and the loader threads' heaviest innermost frames."""
    groups: collections.Counter[str] = collections.Counter()
    loader_frames: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        thread = frames[0]
        names = [f.split(" (")[0] for f in frames[1:]]
        if "MainThread" in thread:
            group = "training loop (main thread)"
        elif "shardkit-" in thread:
            group = "loader threads (shardkit-*)"
            loader_frames[" > ".join(names[-3:])] += n
        elif any("backward" in f.lower() for f in names):
            group = "autograd thread (backward)"
        else:
            group = "other threads"
        groups[group] += n
    if not total:
        return "no samples (py-spy could not read the process?)"
    lines = [f"{total} samples holding the GIL"]
    lines += [f"  {100 * n / total:5.1f}%  {g}" for g, n in groups.most_common()]
    lines.append("heaviest loader frames (innermost three):" if loader_frames else
                 "no loader thread held the GIL (the CPU route works in its worker processes)")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in loader_frames.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments.gil.profile_gil",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="a packed ImageFolder dataset")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "resnet50"])
    parser.add_argument("--size", type=int, default=176)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--feeders", default="auto", help="ShardLoader's feeders: auto or a count (0: the route "
                        "runs in the training process)")
    parser.add_argument("--warmup", type=int, default=30, help="steps before sampling starts")
    parser.add_argument("--seconds", type=int, default=12, help="how long py-spy samples")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--raw", default=None, help="keep py-spy's raw output here")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(spy, os.X_OK):
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    step = TrainStep(args.model, 1000, device, compile=cuda)
    transform = transforms.imagenet_train(args.size, normalize=True, dtype=torch.bfloat16 if cuda else torch.float32,
                                          channels_last=cuda)
    loader = ShardLoader(args.shards, batch_size=args.batch_size, transform=transform, num_workers=args.workers,
                         device=device, drop_last=True,
                         feeders=args.feeders if args.feeders == "auto" else int(args.feeders))
    loader.wait_for_feeders()  # "auto": started now, so the sampled steps are fed as they stay
    batches = map(step.to_device, forever(loader))
    for _ in range(args.warmup):
        step(*next(batches))
    step.sync()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.raw) if args.raw else Path(tmp) / "gil.txt"
        cmd = [spy, "record", "--pid", str(os.getpid()), "--duration", str(args.seconds), "--rate", str(args.rate),
               "--gil", "--threads", "--nonblocking", "--format", "raw", "--output", str(out)]
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        sampler = threading.Thread(target=lambda: result.setdefault(
            "spy", subprocess.run(cmd, capture_output=True, text=True)), daemon=True)
        sampler.start()
        steps, t0 = 0, time.perf_counter()
        while sampler.is_alive():
            step(*next(batches))
            steps += 1
        step.sync()
        seconds = time.perf_counter() - t0
        loader.close()
        spy_run = result.get("spy")
        if spy_run is None or spy_run.returncode != 0 or not out.exists():
            why = spy_run.stderr.strip() if spy_run is not None else "py-spy did not run"
            raise SystemExit(f"py-spy failed: {why}")
        print(f"{args.model} @{args.size}, batch {args.batch_size}, {counted(args.workers, 'worker')}, "
              f"{counted(loader.feeders, 'feeder')} on {device}: "
              f"{steps * args.batch_size / seconds:,.0f} images/s while sampled ({steps} steps)")
        print(summarise(out.read_text()))


if __name__ == "__main__":
    main()
