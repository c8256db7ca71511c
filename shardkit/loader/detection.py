"""Build one detection batch in a worker: COCO samples -> images and torchvision-style targets.

Used by :class:`~shardkit.loader.ShardLoader` when ``manifest.kind == "coco"``. Per sample: read,
decode the image (:func:`~shardkit.codec.decode.decode_rgb`), build the target
(:func:`~shardkit.loader.coco_target.coco_target`), run the detection transform seeded by the
sample's seed (:func:`~shardkit.transforms.detection.run_detection_transform`). The batch carries
the images as a list of uint8 ``[3, H, W]`` tensors (or a :class:`PaddedImages`) and the targets
as a list of dicts in :attr:`Batch.targets`. The bad-sample policy is the classification
builder's (:mod:`shardkit.loader.bad_samples`): ``"replace"`` (counted) or ``"raise"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from shardkit.codec.decode import DecodeStats, decode_rgb
from shardkit.errors import DecodeError, LoaderError
from shardkit.index.manifest import Manifest
from shardkit.loader.bad_samples import BadSample, fill_batch
from shardkit.loader.batch import Batch, BatchBuilder, _image_field
from shardkit.loader.coco_target import BadTarget, coco_target, contiguous_label_map
from shardkit.loader.reader import ShardReader
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.detection import run_detection_transform

__all__ = ["DetectionBatchBuilder", "PaddedImages", "detection_builder", "pad_images", "to_device"]


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


def to_device(value: Any, device: torch.device) -> Any:
    """Move every tensor inside lists, tuples (named too) and dicts to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


class DetectionBatchBuilder(BatchBuilder):
    """Turn ``(shard, index, seed)`` triples of COCO samples into a detection :class:`Batch`.

    Args:
        reader: the dataset's :class:`ShardReader`.
        transform: a detection transform (``transforms.detection_train(...)``,
            ``detection_val(...)`` or any v2-style ``(image, target)`` callable) or None.
        on_error: ``"replace"`` or ``"raise"`` (see :class:`BatchBuilder`).
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
        super().__init__(reader, transform, on_error=on_error)
        self.masks, self.label_map, self.pad = masks, label_map, pad

    def _sample(self, shard: int, index: int, seed: int, stats: StageStats,
                dstats: DecodeStats) -> tuple[torch.Tensor, dict[str, Any]]:
        t0 = time.perf_counter()
        key, fields = self.reader.read(shard, index)
        where = f"{self.reader.store.path(self.reader.shards[shard].url)}:{key}"
        t1 = time.perf_counter()
        stats.read_s += t1 - t0
        try:
            image = decode_rgb(_image_field(fields, where), where=where, stats=dstats)
            if "json" not in fields:
                raise BadSample(f"{where}: no json member (has {sorted(fields)})")
            target = coco_target(fields["json"], image.shape[-2], image.shape[-1], masks=self.masks,
                                 label_map=self.label_map)
        except (DecodeError, BadTarget) as err:
            raise BadSample(f"{where}: {err}") from err
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        if self.transform is not None:
            image, target = run_detection_transform(self.transform, image, target, seed)
        stats.transform_s += time.perf_counter() - t2
        return image, target

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> Batch:
        """Read, decode and transform the given samples, in order."""
        n = len(shards)
        stats, dstats = StageStats(batches=1, samples=n), DecodeStats()
        got = fill_batch(lambda _slot, shard, index, seed: self._sample(shard, index, seed, stats, dstats),
                         self.reader, shards, indices, seeds, on_error=self.on_error)
        images = [image for image, _ in got.results]
        targets = [target for _, target in got.results]
        stats.replaced += got.replaced
        stats.fast, stats.fallback = dstats.fast, dstats.fallback
        batch_images: Any = pad_images(images, self.pad) if self.pad else images
        return Batch(batch_images, torch.empty(0, dtype=torch.int64), got.keys, stats, targets=targets)


def detection_builder(manifest: Manifest, reader: ShardReader, transform: Callable[..., Any] | None, *,
                      on_error: str, masks: bool, pad: bool | int,
                      contiguous_labels: bool) -> DetectionBatchBuilder | None:
    """The builder for a COCO dataset, or None for other kinds (refusing detection-only options)."""
    if manifest.kind != "coco":
        if masks or pad or contiguous_labels:
            raise LoaderError(f"masks, pad and contiguous_labels need a COCO dataset; this one is {manifest.kind!r}")
        return None
    label_map = contiguous_label_map(manifest.categories) if contiguous_labels else None
    return DetectionBatchBuilder(reader, transform, on_error=on_error, masks=masks, label_map=label_map,
                                 pad=int(pad))
