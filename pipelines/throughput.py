"""Throughput: ShardLoader vs torchvision ImageFolder + DataLoader vs plain webdataset.

A short, readable version of ``shardkit bench`` built only on the public API, to read and adapt:

    python pipelines/throughput.py DIR [--workers 2] [--batch-size 64] [--repeats 3] [--shards SHARDS]

DIR is an ImageFolder tree; it is packed first (once) into SHARDS, by default a folder of the
system's temporary directory named after DIR (never beside DIR: that may be a checkout, or
read-only). All three loaders
produce uint8 [B,3,224,224] batches after RandomResizedCrop(224) + horizontal flip, use the same
batch size and workers, and run in alternating order (A B C, C B A, …) so drift cancels.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable

import torch
import torchvision.transforms.v2 as v2
import webdataset as wds
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from shardkit import ShardLoader, transforms
from shardkit.errors import ShardkitError
from shardkit.pack import PackOptions, pack


def torchvision_loader(root: str, batch_size: int, workers: int) -> DataLoader:
    """What a careful user writes today: PIL loader, v2 transforms on PIL images, uint8 out."""
    tf = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    return DataLoader(ImageFolder(root, transform=tf), batch_size=batch_size, shuffle=True,
                      drop_last=True, num_workers=workers, persistent_workers=workers > 0,
                      prefetch_factor=2 if workers else None)


def webdataset_loader(shard_dir: str, batch_size: int, workers: int) -> wds.WebLoader:
    """Plain webdataset on the same shards, PIL decode, the same transform."""
    tf = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    urls = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir) if f.endswith(".tar"))
    dataset = (wds.WebDataset(urls, shardshuffle=False).decode("pil")
               .to_tuple("jpg;png;webp", "cls").map_tuple(tf, int)
               .batched(batch_size, partial=False))
    return wds.WebLoader(dataset, batch_size=None, num_workers=workers,
                         persistent_workers=workers > 0, prefetch_factor=2 if workers else None)


def shardkit_loader(shard_dir: str, batch_size: int, workers: int) -> ShardLoader:
    return ShardLoader(shard_dir, batch_size=batch_size, transform=transforms.imagenet_train(224),
                       num_workers=workers, drop_last=True)


def default_shards(root: str) -> str:
    """Where DIR is packed without ``--shards``: the temporary directory, one folder per tree (its
    name and a hash of its absolute path), so a second run reuses the pack.

    Example::

        default_shards("sample_data/imagefolder")  # /tmp/shardkit-throughput/imagefolder-3f2a9c1d
    """
    import hashlib
    import tempfile

    path = os.path.abspath(root)
    digest = hashlib.sha256(path.encode()).hexdigest()[:8]
    return os.path.join(tempfile.gettempdir(), "shardkit-throughput", f"{os.path.basename(path)}-{digest}")


#: Batches of each run skipped before the clock starts (workers starting, caches filling).
WARMUP = 5


def images_per_second(make: Callable[[], Iterable], epochs: int, warmup: int = WARMUP) -> float:
    """Build a fresh loader, skip ``warmup`` batches, time the rest of ``epochs`` epochs."""
    loader = make()
    images, t0, seen = 0, 0.0, 0
    for _ in range(epochs):
        for _images, labels in loader:
            seen += 1
            if seen == warmup:
                t0 = time.perf_counter()
            elif seen > warmup:
                images += len(labels)
    seconds = time.perf_counter() - t0
    del loader  # persistent workers exit before the next loader starts
    if not images:  # main() checks the batches first; a loader that delivered fewer says so here
        raise SystemExit(f"a loader delivered {seen} batches in {epochs} epochs: none left to time after the "
                         f"{warmup} warm-up batches")
    return images / seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="ImageFolder tree")
    ap.add_argument("--shards", default=None,
                    help="where DIR is packed (reused when it holds a pack) [default: a folder of the temporary "
                         "directory named after DIR]")
    ap.add_argument("--workers", type=at_least(0), default=2, help="workers of every loader [default: 2]")
    ap.add_argument("--batch-size", type=at_least(1), default=64, help="[default: 64]")
    ap.add_argument("--epochs", type=at_least(1), default=2, help="epochs per timed run [default: 2]")
    ap.add_argument("--repeats", type=at_least(1), default=3, help="runs per loader [default: 3]")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        ap.error(f"{args.dir}: no such directory (an ImageFolder tree: one folder of images per class)")
    try:
        images = len(ImageFolder(args.dir))
    except (FileNotFoundError, RuntimeError) as err:  # no class folder, or no image in them
        ap.error(f"{args.dir}: not an ImageFolder tree ({err})")
    batches = args.epochs * (images // args.batch_size)
    if batches <= WARMUP:
        ap.error(f"{args.dir}: {images:,} images make {images // args.batch_size} full batches of "
                 f"{args.batch_size} per epoch, {batches} in {args.epochs} epochs: none left to time after the "
                 f"{WARMUP} warm-up batches; lower --batch-size or raise --epochs")
    args.shards = args.shards or default_shards(args.dir)
    return args


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``low``."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value
    parse.__name__ = "int"  # argparse names a value that is no number by its type's name: "invalid int value"
    return parse


def other_data(root: str, shard_dir: str) -> str | None:
    """How the pack in ``shard_dir`` differs from the tree at ``root`` (its classes, its number of
    images), or None where it matches: the three loaders must read the same images."""
    tree = ImageFolder(root)
    shards = ShardLoader(shard_dir, batch_size=1)
    if shards.manifest.kind != "imagefolder":
        return f"{shard_dir} holds a {shards.manifest.kind} pack, not one of an ImageFolder tree"
    classes = list(shards.classes or ())
    # batches of one at one rank: its samples; and the files the pack skipped, which ImageFolder lists
    packed = len(shards) + sum(len(m.skipped) for m in shards.manifests)
    if packed != len(tree) or len(classes) != len(tree.classes):
        return (f"{shard_dir} holds {packed:,} images of {len(classes)} classes, {root} "
                f"{len(tree):,} of {len(tree.classes)}")
    if classes != tree.classes:
        ours, theirs = next((a, b) for a, b in zip(classes, tree.classes, strict=True) if a != b)
        return f"{shard_dir} names its classes otherwise than {root} ({ours!r} packed, {theirs!r} in the folder)"
    return None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        compare(args)
    except ShardkitError as err:  # a --shards folder that is no pack, is inside DIR, cannot be made, ...
        raise SystemExit(f"throughput.py: error: {err}") from None
    except KeyboardInterrupt:
        print("throughput.py: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def compare(args: argparse.Namespace) -> None:
    """Pack ``args.dir`` into ``args.shards`` where it holds no pack of it, then time the three
    loaders on it, alternating, and print the table."""
    shard_dir = args.shards
    packed = os.path.exists(os.path.join(shard_dir, "index.json"))
    differs = other_data(args.dir, shard_dir) if packed else None
    if differs and shard_dir != default_shards(args.dir):
        raise SystemExit(f"throughput.py: error: {differs}: the loaders would not read the same data (pack "
                         f"{args.dir} into another --shards folder, or omit --shards)")
    if not packed or differs:  # none yet, or the default folder's pack of an earlier state of the tree
        if differs:
            print(f"{differs}: packing it again")
        # Several shards per worker: plain webdataset hands each worker whole shards.
        per_shard = max(1, min(1000, len(ImageFolder(args.dir)) // (4 * max(args.workers, 1))))
        started = time.perf_counter()
        result = pack(args.dir, shard_dir, options=PackOptions(max_count=per_shard),
                      workers=os.cpu_count(), overwrite=bool(differs))
        print(f"packed {result.manifest.num_samples} images into {shard_dir} in "
              f"{time.perf_counter() - started:.1f} s")

    loaders = {
        "torchvision ImageFolder + DataLoader":
            lambda: torchvision_loader(args.dir, args.batch_size, args.workers),
        "webdataset + WebLoader": lambda: webdataset_loader(shard_dir, args.batch_size,
                                                            args.workers),
        "shardkit ShardLoader": lambda: shardkit_loader(shard_dir, args.batch_size, args.workers),
    }
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for r in range(args.repeats):
        for name in list(loaders)[:: 1 if r % 2 == 0 else -1]:  # alternate the order
            rates[name].append(images_per_second(loaders[name], args.epochs))
            print(f"  run {r + 1}: {name}: {rates[name][-1]:,.0f} img/s", flush=True)

    base = rates["torchvision ImageFolder + DataLoader"]
    print(f"\n{'loader':<40}{'img/s (median)':>16}{'x ImageFolder':>16}")
    for name, vals in rates.items():
        # paired per repetition
        ratio = statistics.median(v / b for v, b in zip(vals, base, strict=True))
        print(f"{name:<40}{statistics.median(vals):>16,.0f}{ratio:>15.2f}x")
    print(f"({os.cpu_count()} cores, {args.workers} workers, batch {args.batch_size}, torch "
          f"{torch.__version__})")


if __name__ == "__main__":
    main()
