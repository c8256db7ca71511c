"""The GPU route: workers ship JPEG bytes and crop geometry; the host decodes each batch with
nvJPEG and crops, resizes and flips it in one launch, prepared ahead on CUDA streams."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from shardkit.codec.nvimgcodec import hw_decode_unavailable
from shardkit.loader.gpu.build import RawBatch, RawBatchBuilder
from shardkit.loader.gpu.options import GpuOptions
from shardkit.loader.gpu.pinned import PinnedSlot
from shardkit.loader.gpu.pipeline import DeviceBatch, GpuPipeline
from shardkit.loader.gpu.prefetch import DevicePrefetcher, staging_slots
from shardkit.loader.reader import ShardReader
from shardkit.loader.route import Route
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["GpuRoute", "hw_decode_setup"]

log = logging.getLogger("shardkit.loader")


def hw_decode_setup(options: GpuOptions, device: torch.device) -> tuple[bool | None, bool]:
    """``(hw_planar, hw_only)`` for :class:`DevicePrefetcher`: whether the hardware JPEG engines
    decode (None: no; else planar output or not) and whether they decode alone, from
    ``options.hw_decode`` and a probe of ``device`` (one log line says which, or why not)."""
    hw = options.hw_decode
    reason, planar = ("off", False) if hw == "off" else hw_decode_unavailable(device, options.hw_decode_threads)
    only = reason is None and hw == "only"
    if reason is None:
        log.info("shardkit: hardware JPEG decoder (nvImageCodec) decodes %s on %s",
                 "alone" if only else "beside nvJPEG", device)
    elif hw != "off":
        log.warning("shardkit: no hardware JPEG decoder (%s); nvJPEG decodes alone", reason)
    return (None if reason is not None else planar), only


class GpuRoute(Route[RawBatch, DeviceBatch]):
    """Classification batches decoded and augmented on ``device`` (needs nvJPEG; see
    :func:`~shardkit.loader.routing.choose_route` for the fallback).

    Workers run :class:`RawBatchBuilder` with a buffer cycle of ``prefetch + 2`` per worker; the
    host runs a :class:`DevicePrefetcher` per epoch over :func:`staging_slots` pinned staging
    slots, holding the last ``num_workers * (cycle + 1)`` worker batches so the shared buffers
    stay mapped. When asked for (``options.hw_decode``) and the GPU's hardware JPEG engines work
    through nvImageCodec (probed once per device), the prefetcher runs that decoder beside (or
    instead of) nvJPEG; otherwise nvJPEG decodes alone (one log line says why when it was asked for).
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform, *, device: torch.device, on_error: str,
                 batch_size: int, num_workers: int, prefetch: int, options: GpuOptions,
                 classes: tuple[str, ...] | None = None) -> None:
        self.device, self.options = device, options
        cycle = prefetch + 2
        self.builder: RawBatchBuilder = RawBatchBuilder(reader, transform, on_error=on_error, buffer_cycle=cycle,
                                                        num_classes=len(classes) if classes else None)
        self.classes = classes
        self.pipeline = GpuPipeline(transform, device, compile=options.compile, on_error=on_error)
        self._slots = [PinnedSlot(batch_size, transform.output_size, len(GEOMETRY_COLUMNS), pin=True)
                       for _ in range(staging_slots(options.device_prefetch))]
        self._keep_alive = num_workers * (cycle + 1)
        self._hw_planar, self._hw_only = hw_decode_setup(options, device)
        self._prefetcher: DevicePrefetcher[RawBatch, DeviceBatch] | None = None

    def prepare(self, batches: Iterator[RawBatch], stats: StageStats) -> Iterator[DeviceBatch]:
        """Decode and augment ahead in threads: a new prefetcher per iteration. One still running
        (an iteration abandoned without closing it) is stopped first, so two never pull from the
        same workers; its iterator then ends."""
        self.close()
        self._prefetcher = DevicePrefetcher(batches, self.pipeline, self.device, self._slots, stats,
                                            self.options.device_prefetch, keep_alive=self._keep_alive,
                                            hw_planar=self._hw_planar, hw_only=self._hw_only,
                                            hw_threads=self.options.hw_decode_threads,
                                            decode_threads=self.options.decode_threads)
        return iter(self._prefetcher)

    def finish(self, batch: DeviceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.images, batch.labels  # already finalised on the device by the prefetcher

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
