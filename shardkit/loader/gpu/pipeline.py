"""Main-process GPU stage: one batch of :class:`RawImages` -> a finalised batch on the device.

Per batch (already staged in a pinned slot by the prefetcher): copy the small tensors
(geometry, offsets, labels, CPU-decoded pixels) asynchronously; decode all JPEGs with one batched nvJPEG call; gather
them into one flat buffer; run one crop-resize-flip launch over the batch; drop the CPU-decoded
images into their rows; ``transform.finalize``. Everything is enqueued on the caller's current
stream (the prefetcher's side stream); nothing here synchronises the device in steady state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from shardkit.codec.decode import decode_rgb
from shardkit.codec.nvimgcodec import HwJpegDecoder
from shardkit.codec.nvjpeg import GpuJpegDecoder
from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.gpu.build import RawBatch, RawImages
from shardkit.loader.gpu.pinned import PinnedSlot, chw_offsets
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import Col, crop_resize_flip_batch
from shardkit.transforms.params import CropFlip

__all__ = ["DeviceBatch", "GpuPipeline"]

log = logging.getLogger(__name__)


@dataclass
class DeviceBatch:
    """A GPU-route batch ready for the user: finalised ``images`` and int64 ``labels`` on the
    device, sample ``keys``, and the worker's ``stats`` plus the device stage's counts."""

    images: torch.Tensor
    labels: torch.Tensor
    keys: list[str]
    stats: StageStats


class GpuPipeline:
    """Decode and augment raw batches on ``device`` (see module doc).

    ``compile=False`` uses the eager reference resize instead of the Triton kernel. ``on_error``:
    the bad-sample policy for images that neither nvJPEG nor the CPU can decode (every route's:
    ``"replace"`` by a neighbour of the batch and count, or ``"raise"``).
    """

    def __init__(self, transform: ImageTransform, device: torch.device, *, compile: bool = True,
                 on_error: str = "replace") -> None:
        self.transform = transform
        self.device = device
        self.compile = compile
        self.on_error = on_error
        self.decoder = GpuJpegDecoder(device)
        self._hw_warned = False

    def _decode(self, raw: RawImages, jpegs: list[torch.Tensor], batch: RawBatch,
                rows: list[int] | None = None) -> tuple[list[torch.Tensor], list[int]]:
        """nvJPEG-decode the batch's JPEGs; on failure retry one by one. Returns images and the
        indices (into ``jpegs``) that nvJPEG rejected. ``rows``: each JPEG's row of
        ``raw.geometry`` (default: its position), for the log line."""
        try:
            return self.decoder.decode(jpegs), []
        except RuntimeError:
            pass
        images: list[torch.Tensor] = []
        rejected: list[int] = []
        for i, data in enumerate(jpegs):
            try:
                images.extend(self.decoder.decode([data]))
            except RuntimeError:
                rejected.append(i)
        log.debug("nvJPEG rejected %d images of a batch (keys %s)", len(rejected),
                  [batch.keys[int(raw.geometry[i if rows is None else rows[i], Col.DEST])] for i in rejected])
        return images, rejected

    def _cpu_rescue(self, raw: RawImages, rejected: list[int], out: torch.Tensor, labels: torch.Tensor,
                    batch: RawBatch) -> None:
        """Decode nvJPEG's rejects on the CPU (same crop); replace undecodable ones by a neighbour."""
        bad: list[int] = []
        for i in rejected:
            g = raw.geometry[i].tolist()
            dest = g[Col.DEST]
            try:
                image = decode_rgb(raw.jpegs()[i], where=batch.keys[dest])
            except DecodeError:
                bad.append(dest)
                continue
            # the geometry row holds the box drawn in the worker (centre crops: see ImageTransform.gpu_window)
            box = CropFlip(g[Col.TOP], g[Col.LEFT], g[Col.BOX_H], g[Col.BOX_W], bool(g[Col.FLIP]))
            pixels = self.transform.apply(image, box)
            out[dest].copy_(pixels, non_blocking=False)
        if bad and self.on_error == "raise":
            raise LoaderError(f"bad sample ({batch.keys[bad[0]]}: neither nvJPEG nor the CPU decodes it); "
                              "use on_error='replace' to skip such samples")
        good = [i for i in range(len(out)) if i not in set(bad)]
        if bad and not good:
            raise LoaderError(f"every image of a batch is undecodable ({', '.join(batch.keys)})")
        for dest in bad:
            src = next(j for j in good if j > dest) if any(j > dest for j in good) else good[0]
            out[dest].copy_(out[src])
            labels[dest], batch.keys[dest] = labels[src], batch.keys[src]
        batch.stats.replaced += len(bad)

    def decode(self, batch: RawBatch, slot: PinnedSlot) -> tuple[list[torch.Tensor], list[int]]:
        """Stage 1 (host-synchronous: nvJPEG returns when done): decode the slot's JPEGs."""
        return self._decode(batch.images, slot.jpegs(), batch)

    def decode_many(self, items: list[tuple[RawBatch, PinnedSlot]]) -> list[tuple[list[torch.Tensor], list[int]]]:
        """:meth:`decode` of several staged batches with one nvJPEG call (falls back per batch)."""
        if len(items) == 1:
            return [self.decode(*items[0])]
        lists = [slot.jpegs() for _, slot in items]
        try:
            flat = self.decoder.decode([j for js in lists for j in js])
        except RuntimeError:
            return [self.decode(b, s) for b, s in items]
        out: list[tuple[list[torch.Tensor], list[int]]] = []
        pos = 0
        for js in lists:
            out.append((flat[pos:pos + len(js)], []))
            pos += len(js)
        return out

    def decode_hw(self, items: list[tuple[RawBatch, PinnedSlot]], hw: HwJpegDecoder, stream: torch.cuda.Stream
                  ) -> list[tuple[list[torch.Tensor], list[int]]]:
        """:meth:`decode_many` with the hardware JPEG engines (one call for all ``items``), ready on
        ``stream``; images the engines return as None are decoded by nvJPEG (on the current
        stream, which must be ``stream``), and those nvJPEG rejects too go to the CPU rescue."""
        lists = [slot.jpegs() for _, slot in items]
        datas = [j for js in lists for j in js]
        try:
            flat = hw.decode(datas, stream)
        except Exception as e:  # library trouble mid-run: nvJPEG takes these batches
            if not self._hw_warned:
                log.warning("shardkit: hardware JPEG decode failed (%s: %s); nvJPEG decodes those batches",
                            type(e).__name__, e)
                self._hw_warned = True
            flat = [None] * len(datas)
        out: list[tuple[list[torch.Tensor], list[int]]] = []
        pos = 0
        for (batch, _), js in zip(items, lists, strict=True):
            got, pos = flat[pos:pos + len(js)], pos + len(js)
            batch.stats.gpu_hw_images += sum(g is not None for g in got)
            missing = [i for i, g in enumerate(got) if g is None]
            if not missing:
                out.append(([g for g in got if g is not None], []))
                continue
            raw = batch.images
            images, bad = self._decode(raw, [js[i] for i in missing], batch, rows=missing)
            rejected = [missing[r] for r in bad]
            rescued, skip = iter(images), set(rejected)
            merged = [g if g is not None else next(rescued) for i, g in enumerate(got) if i not in skip]
            out.append((merged, rejected))
        return out

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
            keep = [i for i in range(raw.geometry.shape[0]) if i not in set(rejected)]
            geometry = raw.geometry[keep].to(dev)
            offsets = chw_offsets(raw.geometry[keep]).to(dev)
        if decoded:
            flat = torch.cat([d.reshape(-1) for d in decoded]) if len(decoded) > 1 else decoded[0].reshape(-1)
            crop_resize_flip_batch(flat, offsets, geometry, raw.size, out=out, compile=self.compile)
        if rejected:
            self._cpu_rescue(raw, rejected, out, labels, batch)
        batch.stats.gpu_images += len(decoded)
        batch.stats.gpu_fallback += len(rejected)
        return DeviceBatch(self.transform.finalize(out), labels, batch.keys, batch.stats)

    def __call__(self, batch: RawBatch, slot: PinnedSlot) -> DeviceBatch:
        """Both stages in one call (tests, single-threaded use)."""
        return self.augment(batch, slot, *self.decode(batch, slot))
