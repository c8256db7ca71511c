"""What every device pipeline shares: decoding staged batches' JPEGs, and the augment step it owes.

The device prefetcher (:mod:`~shardkit.loader.routes.device.prefetch`) drives a :class:`DeviceStages`
through two steps per batch: *decode* (batched nvJPEG over the JPEGs a
:class:`~shardkit.loader.routes.device.pinned.PinnedSlot` staged) and *augment* (enqueue the route's
device work and return what the user gets). Decoding is the same for every route (the
classification one, :class:`~shardkit.loader.routes.gpu.host.GpuPipeline`, and the detection one,
:class:`~shardkit.loader.routes.coco_gpu.host.DetectionPipeline`): it is here; each route
implements :meth:`DeviceStages.augment`.

A decode returns ``(images, rejected)``: the decoded uint8 ``[3, H, W]`` images in the order of
the batch's JPEGs, leaving out the indices in ``rejected`` (JPEGs nvJPEG refused, which the
route's augment step decodes on the CPU).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

import torch

from shardkit.codec.nvjpeg import GpuJpegDecoder
from shardkit.errors import LoaderError
from shardkit.loader.routes.device.payload import StagedBatch
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.stats import StageStats
from shardkit.transforms.gpu import Col

__all__ = ["Decoded", "DeviceStages", "ReadyBatch"]

log = logging.getLogger("shardkit.loader.routes.gpu.host")

#: One batch's decode: its images (rejected ones left out) and the rejected JPEGs' indices.
Decoded = tuple[list[torch.Tensor], list[int]]


class ReadyBatch(Protocol):
    """What augment returns: a batch on the device, its keys and stats, and its device tensors
    (the consumer's stream is recorded on each, see the prefetcher)."""

    keys: list[str]
    stats: StageStats

    def tensors(self) -> Iterable[torch.Tensor]: ...


B = TypeVar("B", bound=StagedBatch)
D = TypeVar("D", bound=ReadyBatch)


class DeviceStages(ABC, Generic[B, D]):
    """Decode staged batches on ``device`` (nvJPEG; a CPU ``device`` decodes on the CPU with the
    same batch API, for tests); subclasses add :meth:`augment`. ``on_error``: the bad-sample
    policy for images neither nvJPEG nor the CPU decodes (used by the subclasses' rescue)."""

    def __init__(self, device: torch.device, *, on_error: str = "replace") -> None:
        self.device = device
        self.on_error = on_error
        self.decoder = GpuJpegDecoder(device)

    def _decode(self, slot: PinnedSlot, batch: StagedBatch) -> Decoded:
        """nvJPEG-decode the JPEGs staged in ``slot``; on failure retry one by one. Returns images
        and the indices (into the slot's JPEGs) that nvJPEG rejected. Reads the slot's copies only:
        the worker may be refilling the shared buffer the batch came in."""
        jpegs = slot.jpegs()
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
                  [batch.keys[int(slot.geometry[i, Col.DEST])] for i in rejected])
        return images, rejected

    def decode(self, batch: B, slot: PinnedSlot) -> Decoded:
        """Stage 1 (host-synchronous: nvJPEG returns when done): decode the slot's JPEGs."""
        return self._decode(slot, batch)

    def decode_many(self, items: list[tuple[B, PinnedSlot]]) -> list[Decoded]:
        """:meth:`decode` of several staged batches with one nvJPEG call (falls back per batch)."""
        if len(items) == 1:
            return [self.decode(*items[0])]
        lists = [slot.jpegs() for _, slot in items]
        try:
            flat = self.decoder.decode([j for js in lists for j in js])
        except RuntimeError:
            return [self.decode(b, s) for b, s in items]
        out: list[Decoded] = []
        pos = 0
        for js in lists:
            out.append((flat[pos:pos + len(js)], []))
            pos += len(js)
        return out

    def replacements(self, bad: list[int], batch: StagedBatch) -> list[tuple[int, int]]:
        """``(dest, src)``: the batch row that stands in for each row in ``bad`` (images neither
        nvJPEG nor the CPU decodes), the next good row (cyclically); counted in the batch's
        ``replaced``. Callers copy the row's pixels, label or target, and key.

        Raises:
            LoaderError: ``on_error="raise"`` (naming the first bad sample), or no good row.
        """
        if not bad:
            return []
        if self.on_error == "raise":
            raise LoaderError(f"bad sample ({batch.keys[bad[0]]}: neither nvJPEG nor the CPU decodes it); "
                              "use on_error='replace' to skip such samples")
        good = [i for i in range(len(batch.keys)) if i not in set(bad)]
        if not good:
            raise LoaderError(f"every image of a batch is undecodable ({', '.join(batch.keys)})")
        batch.stats.replaced += len(bad)
        return [(dest, next((j for j in good if j > dest), good[0])) for dest in bad]

    @abstractmethod
    def augment(self, batch: B, slot: PinnedSlot, decoded: list[torch.Tensor], rejected: list[int]) -> D:
        """Stage 2 (enqueues only, on the current stream): turn the decoded images into the
        route's delivered batch; decode ``rejected`` JPEGs on the CPU (the bad-sample policy
        for those that fail there too)."""

    def __call__(self, batch: B, slot: PinnedSlot) -> D:
        """Both stages in one call (tests, single-threaded use)."""
        return self.augment(batch, slot, *self.decode(batch, slot))
