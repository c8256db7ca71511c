"""Choosing the GPU path for a loader, or falling back to the CPU path with one log line."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from shardkit.codec.nvimgcodec import hw_decode_unavailable
from shardkit.codec.nvjpeg import gpu_decode_unavailable
from shardkit.loader.batch import Batch
from shardkit.loader.gpu_batch import RawBatchBuilder
from shardkit.loader.gpu_pipeline import GpuPipeline
from shardkit.loader.pinned import PinnedSlot
from shardkit.loader.prefetch import DevicePrefetcher, ring_size
from shardkit.loader.reader import ShardReader
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["GpuPath", "gpu_path"]

log = logging.getLogger("shardkit.loader")


class GpuPath:
    """What a loader needs for the GPU path: the worker-side builder and the device prefetcher.

    When asked for (``hw_decode="mix"`` or ``"only"``) and the GPU's hardware JPEG engines work
    through nvImageCodec (probed once per device,
    :func:`~shardkit.codec.nvimgcodec.hw_decode_unavailable`), the prefetcher runs that decoder
    beside (or instead of) nvJPEG; otherwise nvJPEG decodes alone (one log line says why when
    it was asked for).
    """

    def __init__(self, transform: ImageTransform, device: torch.device, *, batch_size: int,
                 compile: bool, depth: int, num_workers: int, prefetch: int, hw_decode: str = "off",
                 hw_threads: int = 2) -> None:
        if depth < 2:
            raise ValueError(f"device_prefetch must be >= 2, got {depth}")
        self.transform, self.device = transform, device
        self.pipeline = GpuPipeline(transform, device, compile=compile)
        self._slots = [PinnedSlot(batch_size, transform.output_size, len(GEOMETRY_COLUMNS), pin=True)
                       for _ in range(ring_size(depth))]
        self.depth, self.shm_ring = depth, prefetch + 2
        self.keep_alive = num_workers * (self.shm_ring + 1)
        reason, planar = ("off", False) if hw_decode == "off" else hw_decode_unavailable(device, hw_threads)
        self.hw_planar: bool | None = None if reason is not None else planar
        self.hw_only = reason is None and hw_decode == "only"
        self.hw_threads = hw_threads
        if reason is None:
            log.info("shardkit: hardware JPEG decoder (nvImageCodec) decodes %s on %s",
                     "alone" if self.hw_only else "beside nvJPEG", device)
        elif hw_decode != "off":
            log.warning("shardkit: no hardware JPEG decoder (%s); nvJPEG decodes alone", reason)

    def builder(self, reader: ShardReader, on_error: str) -> RawBatchBuilder:
        return RawBatchBuilder(reader, self.transform, on_error=on_error, shm_ring=self.shm_ring)

    def prefetch(self, source: Iterator[Batch], stats: StageStats) -> DevicePrefetcher:
        return DevicePrefetcher(source, self.pipeline, self.device, self._slots, stats, self.depth,
                                keep_alive=self.keep_alive, hw_planar=self.hw_planar,
                                hw_only=self.hw_only, hw_threads=self.hw_threads)


def gpu_path(transform: ImageTransform, device: torch.device, *, batch_size: int, compile: bool,
             depth: int, num_workers: int, prefetch: int, hw_decode: str = "off",
             hw_threads: int = 2) -> tuple[GpuPath | None, torch.device]:
    """The GPU path for ``device``, or ``(None, device to use)`` after logging why not.

    Without CUDA at all the loader delivers on the CPU; with CUDA but no working nvJPEG it
    decodes on the CPU and delivers on ``device``.
    """
    reason = gpu_decode_unavailable(device)
    if reason is None:
        path = GpuPath(transform, device, batch_size=batch_size, compile=compile, depth=depth,
                       num_workers=num_workers, prefetch=prefetch, hw_decode=hw_decode, hw_threads=hw_threads)
        return path, device
    fallback = device if torch.cuda.is_available() else torch.device("cpu")
    log.warning("shardkit: GPU decoding unavailable (%s); decoding on the CPU, batches on %s", reason, fallback)
    return None, fallback
