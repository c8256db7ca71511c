"""The COCO route's worker half: COCO samples -> images and torchvision-style targets.

Per sample: read, decode the image (:func:`~shardkit.codec.decode.decode_rgb`), build the target
(:func:`~shardkit.loader.routes.coco.target.coco_target`), run the detection transform seeded by the
sample's seed (:func:`~shardkit.transforms.detection.run_detection_transform`). The batch carries
the images packed in one tensor (or a :class:`PaddedImages`) and the targets packed
(:mod:`shardkit.loader.routes.coco.packed`); the route unpacks them into a list of uint8 ``[3, H, W]``
tensors and a list of dicts. The bad-sample policy is every route's (:mod:`shardkit.loader.read.bad_samples`):
``"replace"`` (counted) or ``"raise"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from shardkit.codec.decode import DecodeStats, decode_rgb
from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.read.samples import Sample, SampleSource
from shardkit.loader.read.user_errors import blame
from shardkit.loader.routes.coco.packed import PackedPlanes, PackedTargets
from shardkit.loader.routes.coco.target import BadTarget, coco_target
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.detection import run_detection_transform

__all__ = ["DetectionBatch", "DetectionBatchBuilder", "PaddedImages", "pad_images"]


class PaddedImages(NamedTuple):
    """A batch of images of different sizes in one tensor: ``images`` uint8 ``[B, 3, H, W]``
    zero-padded at the bottom and right, ``sizes`` int64 ``[B, 2]`` each image's ``(h, w)``."""

    images: torch.Tensor
    sizes: torch.Tensor


def pad_images(images: Sequence[torch.Tensor], multiple: int = 1) -> PaddedImages:
    """Stack uint8 ``[3, h, w]`` images into one zero-padded batch; H and W round up to ``multiple``.

    Example:
        >>> p = pad_images([torch.ones(3, 2, 5, dtype=torch.uint8), torch.ones(3, 4, 3, dtype=torch.uint8)], 4)
        >>> tuple(p.images.shape), p.sizes.tolist()
        ((2, 3, 4, 8), [[2, 5], [4, 3]])
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    sizes = torch.tensor([[im.shape[-2], im.shape[-1]] for im in images], dtype=torch.int64).reshape(-1, 2)
    h, w = (-(-int(v) // multiple) * multiple for v in sizes.max(0).values) if len(images) else (0, 0)
    out = torch.zeros((len(images), 3, h, w), dtype=torch.uint8)
    for i, im in enumerate(images):
        out[i, :, : im.shape[-2], : im.shape[-1]] = im
    return PaddedImages(out, sizes)


@dataclass
class DetectionBatch:
    """A detection batch as it travels from a worker (see :mod:`shardkit.loader.routes.coco.packed`):
    ``images`` (the images packed, or one :class:`PaddedImages`), ``targets`` (one per image,
    see :func:`~shardkit.loader.routes.coco.target.coco_target`, packed), sample ``keys`` and the
    worker's ``stats``. :meth:`unpack` gives the lists the user iterates."""

    images: PackedPlanes | PaddedImages
    targets: PackedTargets
    keys: list[str]
    stats: StageStats

    def unpack(self) -> tuple[list[torch.Tensor] | PaddedImages, list[dict[str, Any]]]:
        """``(images, targets)``: a list of uint8 ``[3, H, W]`` (or the :class:`PaddedImages`) and
        one target dict per image, views of the packed tensors."""
        images = self.images.unpack() if isinstance(self.images, PackedPlanes) else self.images
        return images, self.targets.unpack()

    def pin_memory(self) -> DetectionBatch:
        """This batch with its images in page-locked memory (DataLoader's pin-memory thread)."""
        images = self.images
        pinned = (PaddedImages(images.images.pin_memory(), images.sizes) if isinstance(images, PaddedImages)
                  else images.pin_memory())
        return replace(self, images=pinned)


class DetectionBatchBuilder:
    """Turn ``(shard, index, seed)`` triples of COCO samples into a :class:`DetectionBatch`.

    Args:
        reader: the dataset's :class:`ShardReader`.
        transform: a detection transform (``transforms.detection_train(...)``,
            ``detection_val(...)`` or any v2-style ``(image, target)`` callable) or None.
        on_error: ``"replace"`` or ``"raise"`` (see :mod:`shardkit.loader.read.bad_samples`).
        masks: decode instance masks into ``target["masks"]``.
        label_map: category id -> label (e.g. contiguous 1..K); None keeps the ids.
        pad: 0: images as a list; k >= 1: one :class:`PaddedImages` batch, sides multiples of k.
    Raises:
        LoaderError: an :class:`ImageTransform` (a classification transform) was given.
    """

    def __init__(self, reader: ShardReader, transform: Callable[..., Any] | None, *, on_error: str = "replace",
                 masks: bool = False, label_map: dict[Any, int] | None = None, pad: int = 0) -> None:
        if isinstance(transform, ImageTransform):
            raise LoaderError("a COCO dataset needs a detection transform (transforms.detection_train/detection_val), "
                              f"not {type(transform).__name__}")
        if pad < 0:
            raise LoaderError(f"pad must be False, True or a positive multiple, got {pad}")
        self.samples = SampleSource(reader, on_error)
        self.transform = transform
        self.masks, self.label_map, self.pad = masks, label_map, pad

    def build_one(self, sample: Sample, seed: int, stats: StageStats,
                  dstats: DecodeStats) -> tuple[torch.Tensor, dict[str, Any]]:
        """One read sample -> ``(image, target)``: decode, build the target, run the transform
        (adding the seconds to ``stats``). The GPU route's workers run it on images nvJPEG cannot take.

        Raises:
            BadSample: the image does not decode, the sample has no ``json`` member or a bad one.
        """
        t1 = time.perf_counter()
        where = sample.where
        try:
            image = decode_rgb(sample.image(), where=where, stats=dstats)
            if "json" not in sample.fields:
                raise BadSample(f"{where}: no json member (has {sample.members()})")
            target = coco_target(sample.fields["json"], image.shape[-2], image.shape[-1], masks=self.masks,
                                 label_map=self.label_map)
        except (DecodeError, BadTarget) as err:
            raise BadSample(f"{where}: {err}") from err
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        if self.transform is not None:
            try:
                image, target = run_detection_transform(self.transform, image, target, seed)
            except LoaderError as err:
                raise LoaderError(err.message, where=err.where or where) from None
            except Exception as err:
                blame(err, where)
                raise
        stats.transform_s += time.perf_counter() - t2
        return image, target

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> DetectionBatch:
        """Read, decode and transform the given samples, in order."""
        got, stats = self.samples.fill(lambda _slot, sample, seed, stats, dstats:
                                       self.build_one(sample, seed, stats, dstats), shards, indices, seeds)
        images = [image for image, _ in got.results]
        targets = PackedTargets.of([target for _, target in got.results], masks=self.masks)
        return DetectionBatch(pad_images(images, self.pad) if self.pad else PackedPlanes.of(images), targets,
                              got.keys, stats)
