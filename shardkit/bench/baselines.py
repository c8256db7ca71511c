"""The baselines ``shardkit bench`` compares against, written as a careful user writes them.

* torchvision ``ImageFolder`` + ``DataLoader``: PIL loader, v2 transforms on PIL images ending in
  ``PILToTensor`` (uint8 out), ``persistent_workers=True``, ``prefetch_factor=2``,
  ``pin_memory`` on CUDA, shuffled, ``drop_last=True``.
* plain ``webdataset`` on the same shards: ``WebDataset(urls, shardshuffle=False)``, PIL
  decode to RGB, the same v2 transform, ``batched(B, partial=False)`` and a ``WebLoader`` with
  the same worker settings. Where a worker's shards hold fewer than ``B`` images (``rebatch``),
  as webdataset's documentation advises: ``batched(B)`` in the workers, partial batches kept, and
  ``.unbatched().batched(B, partial=False)`` on the ``WebLoader``.

Both produce uint8 ``[B,3,S,S]`` batches and int64 labels, like ShardLoader with
``imagenet_train(S)`` / ``imagenet_val(S)``. Everything handed to workers is picklable.

* COCO: torchvision ``CocoDetection`` wrapped by ``wrap_dataset_for_transforms_v2`` with the
  steps of :func:`shardkit.transforms.detection_train` on PIL images (as torchvision's detection
  references do by default): ``RandomIoUCrop``, ``RandomShortestSize(min, max)``,
  ``RandomHorizontalFlip``, ``PILToTensor``, ``SanitizeBoundingBoxes``; batches are lists of
  uint8 ``[3,H,W]`` images and target dicts, like ShardLoader on a COCO dataset.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torchvision.transforms.v2 as v2
from torch.utils.data import DataLoader

from shardkit.transforms.text import ByteTokenizer

__all__ = ["cocodetection_loader", "imagefolder_loader", "torchvision_transform",
           "webdataset_caption_loader", "webdataset_loader"]

IMAGE_KEYS = "jpg;jpeg;png;webp;ppm;bmp;tif;tiff"


def torchvision_transform(size: int, train: bool) -> v2.Compose:
    """``RandomResizedCrop(size) + RandomHorizontalFlip()`` (train) or
    ``Resize(int(size / 0.875)) + CenterCrop(size)`` (val), then ``PILToTensor()`` (uint8).

    Example:
        >>> torchvision_transform(224, train=False).transforms[0].size
        [256]
    """
    if train:
        steps: list[Any] = [v2.RandomResizedCrop(size), v2.RandomHorizontalFlip()]
    else:
        steps = [v2.Resize(int(size / 0.875)), v2.CenterCrop(size)]
    return v2.Compose([*steps, v2.PILToTensor()])


def _loader_kwargs(workers: int, device: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_workers": workers,
                              "pin_memory": torch.device(device).type == "cuda"}
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=2)
    return kwargs


class _Readable:
    """ImageFolder's ``is_valid_file``: its own extension rule, less the files in ``skip`` (paths
    relative to ``root``). A class, not a closure, so that the dataset stays picklable."""

    def __init__(self, root: str, skip: frozenset[str]) -> None:
        self.root, self.skip = root, skip

    def __call__(self, path: str) -> bool:
        from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

        rel = os.path.relpath(path, self.root).replace(os.sep, "/")
        return has_file_allowed_extension(path, IMG_EXTENSIONS) and rel not in self.skip


def imagefolder_loader(root: str, *, size: int, train: bool, batch_size: int, workers: int,
                       device: str = "cpu", seed: int = 0, skip: frozenset[str] = frozenset()) -> DataLoader[Any]:
    """torchvision ``ImageFolder(root)`` in a shuffled ``DataLoader`` (``drop_last=True``).

    Each ``iter()`` is one epoch of ``(uint8 [B,3,S,S], int64 [B])`` on the CPU (pinned on CUDA).
    ``skip``: files (relative to ``root``, ``/``-separated) left out, as ``shardkit pack`` leaves out
    the ones it cannot read: PIL would raise on them in a worker and end the run.

    Example::

        for images, labels in imagefolder_loader("data/train", size=224, train=True,
                                                 batch_size=64, workers=2):
            ...
    """
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(root, transform=torchvision_transform(size, train),
                          is_valid_file=_Readable(root, skip) if skip else None)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed),
                      **_loader_kwargs(workers, device))


def webdataset_loader(urls: Sequence[str], *, size: int, train: bool, batch_size: int, workers: int,
                      device: str = "cpu", rebatch: bool = False) -> Any:
    """Plain webdataset over local shard paths ``urls``, batched in the workers.

    Each worker reads whole shards (webdataset's ``split_by_worker``) and drops its last partial
    batch, so with shards split evenly the batch count matches ``drop_last=True`` elsewhere.
    ``rebatch``: the workers keep their partial batches and the ``WebLoader`` regroups the images
    into full ones (``.unbatched().batched(batch_size, partial=False)``, as webdataset's
    documentation does), so that workers whose shards hold less than a batch still deliver: every
    epoch then has ``images // batch_size`` batches.
    """
    import webdataset as wds

    dataset = (
        wds.WebDataset(list(urls), shardshuffle=False)
        .decode("pil")  # "pil" converts to RGB, like ImageFolder's loader
        .to_tuple(IMAGE_KEYS, "cls")
        .map_tuple(torchvision_transform(size, train), int)
        .batched(batch_size, partial=rebatch)
    )
    return _web_loader(dataset, batch_size, workers, device, rebatch)


def _web_loader(dataset: Any, batch_size: int, workers: int, device: str, rebatch: bool) -> Any:
    """A ``WebLoader`` over ``dataset`` (batched in the workers); ``rebatch``: regrouped into full
    batches of ``batch_size`` in this process."""
    import webdataset as wds

    loader = wds.WebLoader(dataset, batch_size=None, **_loader_kwargs(workers, device))
    return loader.unbatched().batched(batch_size, partial=False) if rebatch else loader


def _identity(value: Any) -> Any:
    return value


def webdataset_caption_loader(urls: Sequence[str], *, size: int, train: bool, batch_size: int, workers: int,
                              device: str = "cpu", context_length: int = 77, rebatch: bool = False) -> Any:
    """Plain webdataset over captioned shards, as its users write it:
    ``WebDataset(urls).decode("pil").to_tuple("jpg", "txt")`` (any image extension, as
    :func:`webdataset_loader`), the torchvision crop on each image, ``batched`` in the workers and
    the captions of each batch tokenized there (:class:`~shardkit.transforms.ByteTokenizer`);
    a ``WebLoader`` (``rebatch``: as :func:`webdataset_loader`'s).
    Batches are ``(uint8 [B,3,S,S], int64 [B, context_length])``."""
    import webdataset as wds

    dataset = (
        wds.WebDataset(list(urls), shardshuffle=False)
        .decode("pil")
        .to_tuple(IMAGE_KEYS, "txt")
        .map_tuple(torchvision_transform(size, train), _identity)
        .batched(batch_size, partial=rebatch)
        .map_tuple(_identity, ByteTokenizer(context_length))
    )
    return _web_loader(dataset, batch_size, workers, device, rebatch)


def collate_lists(batch: Sequence[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    """``[(image, target), ...]`` -> ``([images], [targets])`` (detection batches stay lists)."""
    images, targets = zip(*batch, strict=True) if batch else ((), ())
    return list(images), list(targets)


def detection_transform(min_size: int, max_size: int) -> v2.Compose:
    """The v2 steps of ``shardkit.transforms.detection_train(min_size, max_size)`` on PIL images."""
    return v2.Compose([v2.RandomIoUCrop(), v2.RandomShortestSize(min_size, max_size=max_size),
                       v2.RandomHorizontalFlip(), v2.PILToTensor(), v2.SanitizeBoundingBoxes()])


def cocodetection_loader(images: str, annotations: str, *, min_size: int, max_size: int, batch_size: int,
                         workers: int, device: str = "cpu", seed: int = 0,
                         skip: frozenset[str] = frozenset()) -> DataLoader[Any]:
    """torchvision ``CocoDetection(images, annotations)`` for v2 transforms in a shuffled
    ``DataLoader`` (``drop_last=True``); batches are ``([uint8 [3,H,W]], [target dicts])``.

    Images without annotations are left out, as torchvision's detection references do for
    training (``RandomIoUCrop`` needs boxes); the bench packs the same images
    (``pack_coco(drop_empty=True)``). ``skip``: image file names left out, as ``shardkit pack``
    leaves out the ones it cannot read."""
    import contextlib
    import io

    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its index building
        coco = CocoDetection(images, annotations, transforms=detection_transform(min_size, max_size))
    coco.ids = [i for i in coco.ids if coco.coco.getAnnIds(imgIds=i)
                and coco.coco.loadImgs(i)[0]["file_name"] not in skip]
    dataset = wrap_dataset_for_transforms_v2(coco, target_keys=("boxes", "labels", "image_id", "area", "iscrowd"))
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, collate_fn=collate_lists,
                      generator=torch.Generator().manual_seed(seed), **_loader_kwargs(workers, device))
