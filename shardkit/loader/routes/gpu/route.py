"""The GPU route: workers ship JPEG bytes and crop geometry; the host decodes each batch with
nvJPEG and crops, resizes and flips it in one launch, prepared ahead on CUDA streams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from shardkit.codec.nvjpeg import gpu_decodes_gray
from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.base import Route, to_device
from shardkit.loader.routes.device.options import GpuOptions
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.routes.device.prefetch import DevicePrefetcher, staging_slots
from shardkit.loader.routes.gpu.host import DeviceBatch, GpuPipeline
from shardkit.loader.routes.gpu.worker import RawBatch, RawBatchBuilder
from shardkit.loader.stats import StageStats
from shardkit.transforms import gpu_kernel
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["GpuRoute"]


class GpuRoute(Route[RawBatch, DeviceBatch]):
    """Classification batches decoded and augmented on ``device`` (needs nvJPEG; see
    :func:`~shardkit.loader.routes.choose.choose_route` for the fallback).

    Workers run :class:`RawBatchBuilder` with a buffer cycle of ``prefetch + 2`` per worker, and
    ship grayscale JPEGs encoded where the device's decoder takes them (``gpu_decodes_gray``); the
    host runs a :class:`DevicePrefetcher` per epoch over :func:`staging_slots` pinned staging
    slots, holding the last ``num_workers * (cycle + 1)`` worker batches so the shared buffers
    stay mapped. ``options.decode_threads`` threads call the batched decoder, each on its own stream.
    Captioned images (``captions``) take it too: the images as for labelled ones, each batch's text
    made in the workers and moved to ``device`` beside them.
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform, *, device: torch.device, on_error: str,
                 batch_size: int, num_workers: int, prefetch: int, options: GpuOptions,
                 classes: tuple[str, ...] | None = None, captions: CaptionTargets | None = None) -> None:
        self.device, self.options = device, options
        cycle = prefetch + 2
        self.builder: RawBatchBuilder = RawBatchBuilder(reader, transform, on_error=on_error, buffer_cycle=cycle,
                                                        num_classes=len(classes) if classes else None,
                                                        captions=captions, gray=gpu_decodes_gray(device))
        self.classes = classes
        self.pipeline = GpuPipeline(transform, device, compile=options.compile, on_error=on_error)
        self._batch_size, self._output_size = batch_size, transform.output_size
        self._slots: list[PinnedSlot] = []  # made on the first iteration (none in a loader whose feeders run the route)
        self._keep_alive = num_workers * (cycle + 1)
        self._prefetcher: DevicePrefetcher[RawBatch, DeviceBatch] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a pickled loader) stages into slots of its own, made on its first iteration, and
        # runs a prefetcher of its own: these hold CUDA events, streams and threads
        return {**self.__dict__, "_slots": [], "_prefetcher": None}

    def before_workers(self) -> None:
        """The new workers must not inherit the mappings of the last ones' buffers."""
        self.builder.buffers.let_go()

    def workers_stopped(self) -> None:
        """Their buffers' mappings go (those of batches still held live on in them)."""
        self.builder.buffers.let_go()

    def workers_started(self) -> None:
        """Compile the crop-resize kernel while the workers read the first batch (a job's first
        compile takes about 2 s, which the first batch would otherwise wait for)."""
        if self.options.compile:
            gpu_kernel.warm_up(self._output_size, self.device)

    def prepare(self, batches: Iterator[RawBatch], stats: StageStats) -> Iterator[DeviceBatch]:
        """Decode and augment ahead in threads: a new prefetcher per iteration. One still running
        (an iteration abandoned without closing it) is stopped first, so two never pull from the
        same workers; its iterator then ends."""
        self.close()
        if not self._slots:
            self._slots = [PinnedSlot(self._batch_size, self._output_size, len(GEOMETRY_COLUMNS), pin=True)
                           for _ in range(staging_slots(self.options.device_prefetch))]
        self._prefetcher = DevicePrefetcher(batches, self.pipeline, self.device, self._slots, stats,
                                            self.options.device_prefetch, keep_alive=self._keep_alive,
                                            decode_threads=self.options.decode_threads)
        return iter(self._prefetcher)

    def finish(self, batch: DeviceBatch) -> tuple[torch.Tensor, Any]:
        if self.builder.captions is None:
            return batch.images, batch.labels  # already finalised on the device by the prefetcher
        return batch.images, to_device(batch.labels, self.device)  # captioned: the text, as the CPU route moves it

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def release(self) -> None:
        """Also drop the pinned staging slots (by their sizes, 10 of about 28 MB each at batch 128
        and 176 px with the default ``device_prefetch``): their memory goes back to torch's
        pinned-memory cache, for this process's next pinned tensors. Emptying that cache to the
        system would wait for the whole device, at a batch of the training loop, and drop the
        program's own cached blocks too."""
        self.close()
        self._slots = []
