"""The CPU route with a transform of your own (torchvision v2 on uint8 tensors), where each sample's
call runs with the global generators seeded from its seed: images per second over whole epochs.

One loader per invocation, ``--epochs`` passes over the packed dataset after one untimed pass;
prints the median rate and each pass's. Run it alternately against two checkouts (``--root``
puts one first on ``sys.path``) for a side-by-side figure::

    python -m benchmarks.user_transform /tmp/x --workers 0 --root /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.user_transform", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="a packed ImageFolder dataset")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--size", type=int, default=64, help="side of the RandomResizedCrop")
    parser.add_argument("--epochs", type=int, default=3, help="timed passes (after one untimed)")
    parser.add_argument("--root", default=None, help="a checkout whose shardkit is imported instead of this one")
    args = parser.parse_args(argv)
    if args.root:
        sys.path.insert(0, args.root)
    import torchvision.transforms.v2 as v2

    import shardkit
    from shardkit import ShardLoader

    transform = v2.Compose([v2.RandomResizedCrop(args.size, antialias=True), v2.RandomHorizontalFlip()])
    loader = ShardLoader(args.shards, batch_size=args.batch_size, transform=transform, num_workers=args.workers)
    rates = []
    for epoch in range(args.epochs + 1):
        start = time.perf_counter()
        images = sum(len(labels) for _images, labels in loader)
        if epoch:
            rates.append(images / (time.perf_counter() - start))
    loader.close()
    print(f"{shardkit.__file__}: {statistics.median(rates):,.0f} img/s (passes: "
          f"{', '.join(f'{r:,.0f}' for r in rates)}), {args.workers} workers")


if __name__ == "__main__":
    main()
