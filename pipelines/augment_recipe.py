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

JITTER = transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4)
ERASE = transforms.RandomErasing(p=0.25, value="random")  # timm's re_prob=0.25, re_mode="pixel"
NORMALIZE = transforms.BatchFormat.make(True, torch.float32, channels_last=False)  # ImageNet mean/std


def augmented_batches(dataset: str, *, size: int, batch_size: int, num_classes: int,
                      seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(images float32 [B,3,size,size], soft labels [B,num_classes])`` of one epoch."""
    loader = ShardLoader(dataset, batch_size=batch_size, transform=transforms.imagenet_train(size), drop_last=True)
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=num_classes)  # needs an even batch size
    generator = torch.Generator().manual_seed(seed)
    for images, labels in loader:  # uint8 [B, 3, size, size] on the loader's device
        images = ERASE(JITTER(images, generator), generator)
        yield mixup(NORMALIZE(images), labels.to(images.device))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("train")
    parser.add_argument("--classes", type=int, default=1000)
    args = parser.parse_args()
    for images, targets in augmented_batches(args.train, size=224, batch_size=256, num_classes=args.classes):
        print(images.shape, targets.shape)


if __name__ == "__main__":
    main()
