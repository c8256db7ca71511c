"""Batch augmentations on what a ShardLoader yields: timm-style training on uint8 batches
(docs/guides/augment.md).

The loader crops, resizes and flips (``transforms.imagenet_train``, ``normalize=False``: uint8
batches); ColorJitter and RandomErasing then run on the whole batch where it lives (the CPU route's
batch on the CPU, the GPU route's on the GPU), then normalisation, then timm's Mixup/CutMix::

    python pipelines/augment_recipe.py shards/train
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch
from timm.data import Mixup

from shardkit import ShardLoader, transforms
from shardkit.errors import ShardkitError

try:  # run as a script: its directory is on the path
    from recipe_args import at_least
except ImportError:  # imported as pipelines.augment_recipe
    from pipelines.recipe_args import at_least

JITTER = transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4)
ERASE = transforms.RandomErasing(p=0.25, value="random")  # timm's re_prob=0.25, re_mode="pixel"
NORMALIZE = transforms.BatchFormat.make(True, torch.float32, channels_last=False)  # ImageNet mean/std


def augmented_batches(dataset: str, *, size: int, batch_size: int, num_classes: int | None = None,
                      seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(images float32 [B,3,size,size], soft labels [B,num_classes])`` of one epoch;
    ``num_classes``: the dataset's own class count unless given.

    Raises:
        ValueError: an odd ``batch_size`` (Mixup pairs each image with another), ``num_classes``
            below the dataset's, or no full batch in an epoch.
    """
    if batch_size % 2:
        raise ValueError(f"batch size {batch_size} is odd: Mixup and CutMix pair each image with another")
    with ShardLoader(dataset, batch_size=batch_size, transform=transforms.imagenet_train(size),
                     drop_last=True) as loader:
        classes = len(loader.classes or ())
        if num_classes is not None and num_classes < classes:
            raise ValueError(f"{dataset} has {classes} classes, more than the {num_classes} given")
        if len(loader) == 0:
            raise ValueError(f"{dataset}: its samples make no full batch of {batch_size}; use a smaller batch size")
        mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=num_classes or classes)
        generator = torch.Generator().manual_seed(seed)
        for images, labels in loader:  # uint8 [B, 3, size, size] on the loader's device
            images = ERASE(JITTER(images, generator), generator)
            yield mixup(NORMALIZE(images), labels.to(images.device))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("train", help="a packed ImageFolder dataset")
    parser.add_argument("--batch-size", type=at_least(1), default=256, help="an even number [default: 256]")
    parser.add_argument("--size", type=at_least(1), default=224, help="side of the training crops [default: 224]")
    parser.add_argument("--classes", type=at_least(1), default=None,
                        help="the model's classes [default: the dataset's]")
    args = parser.parse_args()
    try:
        for images, targets in augmented_batches(args.train, size=args.size, batch_size=args.batch_size,
                                                 num_classes=args.classes):
            print(images.shape, targets.shape)
    except (ValueError, ShardkitError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


if __name__ == "__main__":
    main()
