"""The GPU route alone (no training step) with 0 and more feeder processes, in turn in one run.

For each round and feeder count (in alternating order): one ShardLoader(device="cuda") on the
packed shards delivering uint8 RandomResizedCrop + flip batches (as ``benchmarks.bench_gpu``),
one untimed warm-up epoch (feeders and workers start, Triton compiles), then ``--epochs`` timed epochs
(synchronised at both ends), each a rate in img/s. Prints every epoch and, per feeder count, the
median (min-max) over all rounds.

Run (repository root, a CUDA machine)::

    python -m benchmarks.experiments.feeders.feeders_alone /tmp/shards --feeders 0,2,3,4 --workers 16 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from shardkit import ShardLoader, transforms


def epoch_rates(shards: str, *, feeders: int, workers: int, batch_size: int, size: int, epochs: int) -> list[float]:
    """Images/s of ``epochs`` timed epochs after one warm-up epoch, on one loader."""
    rates = []
    with ShardLoader(shards, batch_size=batch_size, transform=transforms.imagenet_train(size), num_workers=workers,
                     device="cuda", drop_last=True, feeders=feeders) as loader:
        for _batch in loader:  # warm-up epoch
            pass
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            torch.cuda.synchronize()
            t0, images = time.perf_counter(), 0
            for batch, _labels in loader:
                images += batch.shape[0]
            torch.cuda.synchronize()
            rates.append(images / (time.perf_counter() - t0))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.experiments.feeders.feeders_alone",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("shards")
    ap.add_argument("--feeders", default="0,2,3,4", help="comma-separated feeder counts")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per loader")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    counts = [int(x) for x in args.feeders.split(",")]
    if not all(0 <= n <= args.workers for n in counts):
        ap.error(f"--feeders: each count must be from 0 to --workers ({args.workers}), got {args.feeders}")
    results: dict[int, list[float]] = {n: [] for n in counts}
    for rnd in range(args.rounds):
        for n in counts if rnd % 2 == 0 else counts[::-1]:  # alternating order: A B C, C B A, ...
            rates = epoch_rates(args.shards, feeders=n, workers=args.workers, batch_size=args.batch_size,
                                size=args.size, epochs=args.epochs)
            results[n] += rates
            print(f"feeders={n} round {rnd}: " + ", ".join(f"{r:,.0f}" for r in rates), flush=True)
    for n, rates in results.items():
        print(f"feeders={n}: median {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) img/s "
              f"over {len(rates)} epochs")


if __name__ == "__main__":
    main()
