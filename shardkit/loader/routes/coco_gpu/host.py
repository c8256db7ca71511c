"""Main-process device stage of the COCO GPU route: a decoded batch -> images and targets on the device.

Per batch, after the shared decode stage (:class:`~shardkit.loader.routes.device.stages.DeviceStages`:
batched nvJPEG over the JPEGs a pinned slot staged): lay the outputs out
(:func:`~shardkit.transforms.gpu_ragged.ragged_layout`: back to back for a list of images, or
one zero-padded canvas with ``pad``), copy the images decoded in the workers into their places,
run one crop-resize-flip launch over the JPEGs, each to its own size
(:func:`~shardkit.transforms.gpu_ragged.crop_resize_flip_ragged`), copy each target field of
the batch to the device once and split it per image; masks, when asked for, are resized
(nearest, torchvision's ``resize_mask``) and flipped image by image on the device. Everything is
enqueued on the current stream (the prefetcher's); the only host waits are the copies from
pageable memory of the small target arrays.

JPEGs that nvJPEG rejects are decoded on the CPU and cropped, resized and flipped there by the
same geometry (torch's CPU resize, as the CPU route's); those the CPU cannot decode either take
the next good image of the batch, with its target and key (or raise, per ``on_error``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torchvision.transforms.v2 import functional as TF

from shardkit.codec.decode import decode_rgb
from shardkit.errors import DecodeError
from shardkit.loader.routes.coco.worker import PaddedImages
from shardkit.loader.routes.coco_gpu.worker import RawDetectionBatch, RawMasks
from shardkit.loader.routes.device.pinned import PinnedSlot, chw_offsets
from shardkit.loader.routes.device.stages import DeviceStages
from shardkit.loader.stats import StageStats
from shardkit.transforms.gpu import GEOMETRY_COLUMNS, Col, flat_images
from shardkit.transforms.gpu_ragged import crop_resize_flip_ragged, ragged_images, ragged_layout
from shardkit.transforms.ops import crop_resize_flip
from shardkit.transforms.params import CropFlip

__all__ = ["DetectionDeviceBatch", "DetectionPipeline"]


@dataclass
class DetectionDeviceBatch:
    """A COCO GPU-route batch ready for the user: ``images`` (a list of uint8 ``[3, H, W]`` or
    one :class:`~shardkit.loader.routes.coco.PaddedImages`) and ``targets`` (dicts as the CPU route's)
    on the device, sample ``keys``, ``stats``; ``storage``: the device tensors the images and
    targets are views of."""

    images: list[torch.Tensor] | PaddedImages
    targets: list[dict[str, Any]]
    keys: list[str]
    stats: StageStats
    storage: tuple[torch.Tensor, ...]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.storage


def _staged(slot: PinnedSlot) -> tuple[list[list[int]], list[int]]:
    """The staged batch's geometry rows and CPU-image positions, read from the slot's copies: the
    worker's shared buffer may hold a later batch by the time augment runs (the buffer cycle's
    safety argument covers staging only, see :mod:`shardkit.loader.routes.gpu.worker`)."""
    k, m, _ = slot.counts
    return slot.geometry[:k].tolist(), slot.cpu_dest[:m].tolist()


def _sizes(rows: list[list[int]], cpu_dest: list[int], pixels: list[torch.Tensor], n: int) -> list[tuple[int, int]]:
    """Each position's output size: JPEGs from their geometry rows, worker pixels from their shape."""
    sizes = [(0, 0)] * n
    for row in rows:
        sizes[row[Col.DEST]] = (row[Col.VIRT_H], row[Col.VIRT_W])
    for dest, px in zip(cpu_dest, pixels, strict=True):
        sizes[dest] = (int(px.shape[-2]), int(px.shape[-1]))
    return sizes


def _targets(batch: RawDetectionBatch, device: torch.device) -> tuple[list[dict[str, Any]], list[torch.Tensor]]:
    """Per-image target dicts of views into one device tensor per field (and the tensors)."""
    fields = {k: v.to(device, non_blocking=True) for k, v in batch.targets.tensors().items()}
    return batch.targets.unpack(fields), list(fields.values())


def _masks(masks: RawMasks, device: torch.device) -> list[torch.Tensor]:
    """Each image's masks on ``device``, resized to its output size and flipped when it was."""
    out = []
    for planes, size, flip in zip(masks.planes.unpack(), masks.sizes, masks.flips, strict=True):
        m = planes.to(device, non_blocking=True)
        if m.shape[0] == 0:
            out.append(torch.zeros((0, *size), dtype=torch.uint8, device=device))
            continue
        if tuple(m.shape[-2:]) != size:
            m = TF.resize_mask(m, list(size))  # nearest, as v2 resizes the CPU route's masks
        out.append(m.flip(-1) if flip else m)
    return out


class DetectionPipeline(DeviceStages[RawDetectionBatch, DetectionDeviceBatch]):
    """Decode and augment COCO GPU-route batches on ``device`` (see the module doc).

    ``pad``: 0 for a list of images, k >= 1 for one :class:`PaddedImages` with sides rounded up
    to k. ``compile=False``: the eager reference resize instead of the Triton kernel.
    ``on_error``: for images neither nvJPEG nor the CPU decodes.
    """

    def __init__(self, device: torch.device, *, pad: int = 0, compile: bool = True,
                 on_error: str = "replace") -> None:
        super().__init__(device, on_error=on_error)
        self.pad, self.compile = pad, compile

    def augment(self, batch: RawDetectionBatch, slot: PinnedSlot, decoded: list[torch.Tensor],
                rejected: list[int]) -> DetectionDeviceBatch:
        n, dev = len(batch.images), self.device
        geometry, offsets, _, _, _ = slot.to_device(dev)
        rows, cpu_dest = _staged(slot)
        sizes = _sizes(rows, cpu_dest, batch.pixels, n)
        places, shape = ragged_layout(sizes, self.pad)
        out = torch.zeros(shape, dtype=torch.uint8, device=dev) if self.pad else \
            torch.empty(shape, dtype=torch.uint8, device=dev)
        views = ragged_images(out, places, sizes)
        for dest, px in zip(cpu_dest, batch.pixels, strict=True):
            views[dest].copy_(px, non_blocking=True)
        if rejected:  # rare: rebuild geometry and offsets for the images nvJPEG did decode
            kept = torch.tensor([r for i, r in enumerate(rows) if i not in set(rejected)],
                                dtype=torch.int32).reshape(-1, len(GEOMETRY_COLUMNS))
            geometry, offsets = kept.to(dev), chw_offsets(kept).to(dev)
        if decoded:
            flat = flat_images(decoded)
            largest = max(h * w for h, w in sizes)
            crop_resize_flip_ragged(flat, offsets, geometry, out, places.to(dev, non_blocking=True), largest=largest,
                                    compile=self.compile)
        targets, storage = _targets(batch, dev)
        if batch.masks is not None:
            masks = _masks(batch.masks, dev)
            for target, m in zip(targets, masks, strict=True):
                target["masks"] = m
            storage += masks
        bad = self._cpu_rescue(batch, slot, rows, rejected, views)
        images: list[torch.Tensor] | PaddedImages = views
        for dest, src in self.replacements(bad, batch):  # the stand-in shares its source's tensors
            views[dest] = views[src]
            sizes[dest] = sizes[src]
            targets[dest], batch.keys[dest] = targets[src], batch.keys[src]
            if self.pad:
                out[dest].copy_(out[src])
        if self.pad:
            images = PaddedImages(out, torch.tensor(sizes, dtype=torch.int64).reshape(-1, 2).to(dev))
            storage.append(images.sizes)
        batch.stats.gpu_images += len(decoded)
        batch.stats.gpu_fallback += len(rejected)
        return DetectionDeviceBatch(images, targets, batch.keys, batch.stats, (out, *storage))

    def _cpu_rescue(self, batch: RawDetectionBatch, slot: PinnedSlot, rows: list[list[int]], rejected: list[int],
                    views: list[torch.Tensor]) -> list[int]:
        """Decode nvJPEG's rejects (the slot's copies) on the CPU and apply their geometry; return
        the positions that do not decode there either."""
        jpegs, bad = slot.jpegs(), []
        for i in rejected:
            g = rows[i]
            dest = g[Col.DEST]
            try:
                image = decode_rgb(jpegs[i], where=batch.keys[dest])
            except DecodeError:
                bad.append(dest)
                continue
            box = CropFlip(g[Col.TOP], g[Col.LEFT], g[Col.BOX_H], g[Col.BOX_W], bool(g[Col.FLIP]))
            views[dest].copy_(crop_resize_flip(image, box, (g[Col.VIRT_H], g[Col.VIRT_W])))
        return bad
