"""The COCO GPU route: workers ship JPEG bytes, the seeded geometry and finished targets; the
host decodes each batch with nvJPEG and crops, resizes and flips it in one launch, prepared
ahead on CUDA streams by the classification GPU route's device prefetcher."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from shardkit.codec.nvjpeg import gpu_decodes_gray
from shardkit.index.manifest import Manifest
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.base import Route
from shardkit.loader.routes.coco.route import coco_labels
from shardkit.loader.routes.coco_gpu.host import DetectionDeviceBatch, DetectionPipeline
from shardkit.loader.routes.coco_gpu.worker import RawDetectionBatch, RawDetectionBuilder
from shardkit.loader.routes.device.options import GpuOptions
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.routes.device.prefetch import DevicePrefetcher, staging_slots
from shardkit.loader.stats import StageStats
from shardkit.transforms import gpu_ragged_kernel
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["CocoGpuRoute"]


class CocoGpuRoute(Route[RawDetectionBatch, DetectionDeviceBatch]):
    """Detection batches ``(images, targets)`` of a COCO dataset decoded and augmented on ``device``:
    the same samples, boxes, labels, area, iscrowd and masks as :class:`~shardkit.loader.routes.coco.CocoRoute`
    for the same seed, pixels within the resize's rounding and the decoders' differences.

    Needs a transform :func:`~shardkit.transforms.detection_geometry.gpu_unsupported` accepts and
    nvJPEG (see :func:`~shardkit.loader.routes.choose.choose_route` for the fallback). Workers run
    :class:`RawDetectionBuilder` with a buffer cycle of ``prefetch + 2`` per worker; the host runs
    a :class:`~shardkit.loader.routes.device.prefetch.DevicePrefetcher` per epoch over pinned staging
    slots, holding the last ``num_workers * (cycle + 1)`` worker batches so the shared buffers
    stay mapped (the classification GPU route's arrangement and safety argument). On a CPU
    ``device`` the same stages run in the calling thread, decoding with libjpeg-turbo: how the
    route is tested without a GPU.
    """

    def __init__(self, manifest: Manifest, reader: ShardReader, transform: Any, *, device: torch.device,
                 on_error: str, batch_size: int, num_workers: int, prefetch: int, options: GpuOptions,
                 masks: bool, pad: bool | int, contiguous_labels: bool) -> None:
        self.device, self.options = device, options
        self.label_map, self.classes = coco_labels(manifest, contiguous_labels)
        cycle = prefetch + 2
        self.builder: RawDetectionBuilder = RawDetectionBuilder(reader, transform, on_error=on_error, masks=masks,
                                                                label_map=self.label_map, buffer_cycle=cycle,
                                                                gray=gpu_decodes_gray(device))
        self.pipeline = DetectionPipeline(device, pad=int(pad), compile=options.compile, on_error=on_error)
        self._batch_size = batch_size
        self._slots: list[PinnedSlot] = []  # made on the first iteration
        self._keep_alive = num_workers * (cycle + 1)
        self._prefetcher: DevicePrefetcher[RawDetectionBatch, DetectionDeviceBatch] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a pickled loader) stages into slots of its own, made on its first iteration, and
        # runs a prefetcher of its own: these hold CUDA events, streams and threads
        return {**self.__dict__, "_slots": [], "_prefetcher": None}

    def _staging(self) -> list[PinnedSlot]:
        """The staging slots, made on first use: pinned, as many as ``device_prefetch`` keeps in
        flight, on a CUDA device; one, not pinned, where the stages run in the calling thread."""
        if not self._slots:
            cuda = self.device.type == "cuda"
            self._slots = [PinnedSlot(self._batch_size, (0, 0), len(GEOMETRY_COLUMNS), pin=cuda)
                           for _ in range(staging_slots(self.options.device_prefetch) if cuda else 1)]
        return self._slots

    def before_workers(self) -> None:
        """The new workers must not inherit the mappings of the last ones' buffers."""
        self.builder.buffers.let_go()

    def workers_stopped(self) -> None:
        """Their buffers' mappings go (those of batches still held live on in them)."""
        self.builder.buffers.let_go()

    def workers_started(self) -> None:
        """Compile the resize kernel while the workers read the first batch (as the
        classification GPU route does)."""
        if self.options.compile:
            gpu_ragged_kernel.warm_up(self.device)

    def prepare(self, batches: Iterator[RawDetectionBatch], stats: StageStats) -> Iterator[DetectionDeviceBatch]:
        """Decode and augment ahead in threads (a new prefetcher per iteration; one still running
        is stopped first, as on the classification GPU route); on a CPU device, in this thread."""
        self.close()
        if self.device.type != "cuda":
            return self._in_this_thread(batches)
        self._prefetcher = DevicePrefetcher(batches, self.pipeline, self.device, self._staging(), stats,
                                            self.options.device_prefetch, keep_alive=self._keep_alive)
        return iter(self._prefetcher)

    def _in_this_thread(self, batches: Iterator[RawDetectionBatch]) -> Iterator[DetectionDeviceBatch]:
        slot = self._staging()[0]
        for batch in batches:
            slot.stage(batch)
            yield self.pipeline(batch, slot)

    def finish(self, batch: DetectionDeviceBatch) -> tuple[Any, Any]:
        return batch.images, batch.targets  # already on the device

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
