"""Main-process GPU stage: one batch of :class:`RawImages` -> a finalised batch on the device.

Per batch (already staged in a pinned slot by the prefetcher): copy the small tensors
(geometry, offsets, labels, CPU-decoded pixels) asynchronously; decode all JPEGs with one batched nvJPEG call; gather
them into one flat buffer; run one crop-resize-flip launch over the batch; drop the CPU-decoded
images into their rows; ``transform.finalize``. Everything is enqueued on the caller's current
stream (the prefetcher's side stream); nothing here synchronises the device in steady state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardkit.codec.decode import decode_rgb
from shardkit.errors import DecodeError
from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.routes.device.pinned import PinnedSlot, chw_offsets
from shardkit.loader.routes.device.stages import DeviceStages
from shardkit.loader.routes.gpu.worker import RawBatch
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import Col, crop_resize_flip_batch, flat_images
from shardkit.transforms.params import CropFlip

__all__ = ["DeviceBatch", "GpuPipeline"]


@dataclass
class DeviceBatch:
    """A GPU-route batch ready for the user: finalised ``images`` and int64 ``labels`` on the
    device (captioned images: the batch's text, its tensors still where the worker made them),
    sample ``keys``, and the worker's ``stats`` plus the device stage's counts."""

    images: torch.Tensor
    labels: torch.Tensor | Any
    keys: list[str]
    stats: StageStats

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The device tensors made on the prefetcher's stream: the images, and the labels of a
        labelled batch. A captioned batch's text (a tensor, a dict of them, strings) is still where
        the worker made it, on the CPU: :meth:`~shardkit.loader.routes.gpu.route.GpuRoute.finish` moves it later."""
        labels = self.labels
        on_device = isinstance(labels, torch.Tensor) and labels.device == self.images.device
        return (self.images, labels) if on_device else (self.images,)


class GpuPipeline(DeviceStages[RawBatch, DeviceBatch]):
    """Decode and augment raw batches on ``device`` (see module doc).

    ``compile=False`` uses the eager reference resize instead of the Triton kernel. ``on_error``:
    the bad-sample policy for images that neither nvJPEG nor the CPU can decode (every route's:
    ``"replace"`` by a neighbour of the batch and count, or ``"raise"``).
    """

    def __init__(self, transform: ImageTransform, device: torch.device, *, compile: bool = True,
                 on_error: str = "replace") -> None:
        super().__init__(device, on_error=on_error)
        self.transform = transform
        self.compile = compile

    def _cpu_rescue(self, slot: PinnedSlot, rejected: list[int], out: torch.Tensor, labels: torch.Tensor,
                    batch: RawBatch) -> bool:
        """Decode nvJPEG's rejects on the CPU (same crop); replace undecodable ones by a neighbour
        (True when it did: the rows' labels moved with them). Reads the slot's copies: by now the
        worker may be writing a later batch into the shared buffer the batch came in."""
        bad: list[int] = []
        jpegs = slot.jpegs()
        for i in rejected:
            g = slot.geometry[i].tolist()
            dest = g[Col.DEST]
            try:
                image = decode_rgb(jpegs[i], where=batch.keys[dest])
            except DecodeError:
                bad.append(dest)
                continue
            # the geometry row holds the box drawn in the worker (centre crops: see ImageTransform.gpu_window)
            box = CropFlip(g[Col.TOP], g[Col.LEFT], g[Col.BOX_H], g[Col.BOX_W], bool(g[Col.FLIP]))
            pixels = self.transform.apply(image, box)
            out[dest].copy_(pixels, non_blocking=False)
        moved = self.replacements(bad, batch)
        for dest, src in moved:
            out[dest].copy_(out[src])
            labels[dest], batch.keys[dest] = labels[src], batch.keys[src]
        return bool(moved)

    def augment(self, batch: RawBatch, slot: PinnedSlot, decoded: list[torch.Tensor],
                rejected: list[int]) -> DeviceBatch:
        """Stage 2 (enqueues only): copy the slot's small tensors, crop-resize-flip, finalize."""
        raw = batch.images
        n, dev = len(raw), self.device
        geometry, offsets, cpu_images, cpu_dest, labels = slot.to_device(dev)
        out = torch.empty((n, 3, *raw.size), dtype=torch.uint8, device=dev)
        if cpu_images.shape[0]:
            out.index_copy_(0, cpu_dest, cpu_images)
        if rejected:  # rare: rebuild geometry and offsets for the images nvJPEG did decode
            staged = slot.geometry[:slot.counts[0]]
            keep = [i for i in range(staged.shape[0]) if i not in set(rejected)]
            geometry = staged[keep].to(dev)
            offsets = chw_offsets(staged[keep]).to(dev)
        if decoded:
            flat = flat_images(decoded)
            crop_resize_flip_batch(flat, offsets, geometry, raw.size, out=out, compile=self.compile)
        moved = self._cpu_rescue(slot, rejected, out, labels, batch) if rejected else False
        batch.stats.gpu_images += len(decoded)
        batch.stats.gpu_fallback += len(rejected)
        if batch.texts is None:
            return DeviceBatch(self.transform.finalize(out), labels, batch.keys, batch.stats)
        # captioned: the labels are text rows; after a replacement (rare: it waits for the device) the text follows
        texts = CaptionTargets.take(batch.texts, labels.tolist()) if moved else batch.texts
        return DeviceBatch(self.transform.finalize(out), texts, batch.keys, batch.stats)
