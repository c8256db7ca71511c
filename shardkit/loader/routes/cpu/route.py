"""The CPU route: workers decode and transform; the host copies each batch to the device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.base import DirectRoute, to_device
from shardkit.loader.routes.cpu.shared_pool import SharedBatchPool
from shardkit.loader.routes.cpu.worker import CpuBatch, CpuBatchBuilder
from shardkit.transforms.base import ImageTransform

__all__ = ["CpuRoute"]


class CpuRoute(DirectRoute[CpuBatch]):
    """Classification batches decoded and transformed in the workers (see :class:`CpuBatchBuilder`).

    With worker processes and an :class:`ImageTransform`, batches travel in a
    :class:`SharedBatchPool` of ``prefetch + 3`` slots per worker: ``prefetch`` batches in the
    pipeline, plus those the consumer (and the delivery loop) still hold; a worker whose slots
    are all busy allocates instead. On the host an :class:`ImageTransform`'s ``finalize``
    (e.g. normalise to float) runs on ``device``, after the copy.

    Captioned images (``captions``) take this route too: the same images, with each batch's text
    (:class:`~shardkit.loader.read.captions.CaptionTargets`) in place of the labels; tensors in it
    (a tokenizer's output) are moved to ``device``.
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform | Callable[..., Any] | None, *,
                 device: torch.device, on_error: str, batch_size: int, num_workers: int, prefetch: int,
                 classes: tuple[str, ...] | None = None, captions: CaptionTargets | None = None) -> None:
        pool = None
        if num_workers > 0 and isinstance(transform, ImageTransform):
            pool = SharedBatchPool(num_workers=num_workers, slots_per_worker=prefetch + 3,
                                   shape=(batch_size, 3, *transform.output_size))
        self.builder: CpuBatchBuilder = CpuBatchBuilder(reader, transform, on_error=on_error, pool=pool,
                                                        num_classes=len(classes) if classes else None,
                                                        captions=captions)
        self.classes = classes
        self.transform = transform
        self.device = device
        self.pin_memory = device.type == "cuda"

    @property
    def pool(self) -> SharedBatchPool | None:
        """The shared batch pool the workers fill (None without workers or an ImageTransform)."""
        return self.builder.pool

    def before_workers(self) -> None:
        """A copied loader gets a pool of its own, and slots left busy by batches that never
        arrived (workers stopped mid-flight) are freed."""
        pool = self.builder.pool
        if pool is None:
            return
        if pool.owned():
            pool.reclaim()
        else:  # unpickled or deep-copied: its flags are shared with the original's
            self.builder.pool = pool.fresh()

    def finish(self, batch: CpuBatch) -> tuple[Any, Any]:
        pool = self.builder.pool
        if pool is not None:  # the slots of batches the consumer dropped are free again
            pool.collect()
        images = batch.images
        labels = to_device(batch.labels, self.device)  # captioned images: text, a dict of fields
        if not isinstance(images, torch.Tensor):
            return to_device(images, self.device), labels
        images = images.to(self.device, non_blocking=True)
        if isinstance(self.transform, ImageTransform):
            images = self.transform.finalize(images)
        return images, labels

    def workers_stopped(self) -> None:
        """Free the slots of batches that were in flight (torch dropped them unread)."""
        pool = self.builder.pool
        if pool is not None and pool.owned():
            pool.reclaim()
