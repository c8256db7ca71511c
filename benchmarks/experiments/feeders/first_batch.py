"""Seconds from ``ShardLoader(...)`` to the first batch: ``feeders="auto"`` (feeders started behind
the first batches, which come from this process meanwhile) against the same number of feeders
asked for by number (started before the first batch), and against none; in alternating order,
each run in a fresh process (the feeders' forkserver and imports are part of what is timed).

Each run also says when the feeders were up, how many batches came from this process until then
(taken one after another, as fast as they come) and the longest wait for one of them, and the
seconds for the next ``--batches`` batches. On the CPU, where ``"auto"`` runs no feeders,
``--auto-feeders N`` makes it choose N as the GPU route does, so the start behind the first
batches can be measured on any machine; on CUDA ``"auto"`` chooses for itself.

    python -m benchmarks.experiments.feeders.first_batch /tmp/shards --device cpu --workers 2 \\
        --auto-feeders 1 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def _one(shards: str, device: str, workers: int, feeders: str, auto_feeders: int, batches: int) -> dict[str, float]:
    """One run in this process: constructor, first batch, feeders up, the next batches."""
    import shardkit.loader.loader as loader_module
    from shardkit import ShardLoader, transforms
    from shardkit.loader.feed.labels import SlotLabels

    if feeders == "auto" and auto_feeders and device == "cpu":
        loader_module.feeder_count = lambda *args, **kwargs: (auto_feeders, SlotLabels())  # as on the GPU route
    if device == "cuda":
        torch.zeros(1, device="cuda")  # a training script has its CUDA context before its loader
    t0 = time.perf_counter()
    loader = ShardLoader(shards, batch_size=64, transform=transforms.imagenet_train(176), num_workers=workers,
                         device=device, drop_last=True, feeders=feeders if feeders == "auto" else int(feeders))
    t1 = time.perf_counter()
    it = iter(loader)
    next(it)
    t2 = time.perf_counter()
    gap, taken, last = 0.0, 1, t2  # batches until the feeders deliver, and the longest wait among them
    while loader._supply.pool is not None and not loader._supply.pool.running and taken < 2000:
        if next(it, None) is None:  # an epoch's end: the next epoch's first batch is the next one counted
            it = iter(loader)
            continue
        now = time.perf_counter()
        gap, taken, last = max(gap, now - last), taken + 1, now
    loader.wait_for_feeders()
    t3 = time.perf_counter()
    for _ in range(batches):
        if next(it, None) is None:
            it = iter(loader)
    t4 = time.perf_counter()
    out = {"constructor_s": t1 - t0, "first_batch_s": t2 - t0, "feeders_up_s": t3 - t0,
           "batches_meanwhile": taken, "longest_wait_meanwhile_s": gap, "next_batches_s": t4 - t3,
           "feeders": loader.feeders}
    loader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--auto-feeders", type=int, default=1, help="on the CPU: the feeders 'auto' chooses")
    parser.add_argument("--feeders", default="", help="the number to compare with (default: what auto chooses)")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a run in a child process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(_one(args.shards, args.device, args.workers, args.one, args.auto_feeders, args.batches)))
        return
    number = args.feeders or (str(args.auto_feeders) if args.device == "cpu" else "3")
    modes = ["auto", number, "0"]
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            cmd = [sys.executable, "-m", "benchmarks.experiments.feeders.first_batch", args.shards, "--device",
                   args.device, "--workers", str(args.workers), "--auto-feeders", str(args.auto_feeders),
                   "--batches", str(args.batches), "--one", mode]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"feeders={mode}: run failed: {done.stderr.strip().splitlines()[-1:]}")
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for mode, rows in runs.items():
        summary = {"feeders_asked": mode, "feeders": rows[0]["feeders"], "runs": len(rows)}
        for key in ("first_batch_s", "feeders_up_s", "batches_meanwhile", "longest_wait_meanwhile_s", "next_batches_s"):
            values = [row[key] for row in rows]
            summary[key] = [round(statistics.median(values), 2), round(min(values), 2), round(max(values), 2)]
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
