"""The COCO GPU route's worker half: JPEG bytes, the seeded geometry and the finished targets.

Per sample: read it, take the image size from the JPEG header, build the target
(:func:`~shardkit.loader.routes.coco.target.coco_target`) and draw the transform's geometry with
:func:`~shardkit.transforms.detection_geometry.draw_geometry`: the CPU route's own transform
run on a stand-in image with the sample's seed, so crop box, output size, flip and the
transformed (sanitized) boxes, labels, area and iscrowd are the CPU route's. The JPEG travels
encoded with one geometry row (the box resized to the output size, flipped); masks travel
cropped to the box (rows of the kept boxes only) and are resized and flipped on the device.
Images nvJPEG cannot take (:func:`~shardkit.codec.nvjpeg.nvjpeg_friendly`: CMYK, progressive,
PNG, ..., and grayscale where the device's decoder does not take it, ``gray``) go through the
CPU route's own worker step (:meth:`~shardkit.loader.routes.coco.worker.DetectionBatchBuilder.build_one`)
and travel as pixels.

What a batch carries (:class:`RawDetectionBatch`): the JPEGs and geometry in one
:class:`~shardkit.loader.routes.device.payload.RawImages` blob in the worker's shared-memory buffer cycle
(reuse is safe for the reason :mod:`shardkit.loader.routes.device.payload` gives; each sample read
straight into it and its JPEG left there, as :mod:`shardkit.loader.routes.gpu.worker` does), the targets and masks
packed as on the CPU route (:mod:`shardkit.loader.routes.coco.packed`: no shared-memory handle per
tensor), the masks with the size and flip each gets on the device (:class:`RawMasks`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.codec.decode import DecodeStats, peek_size
from shardkit.codec.nvjpeg import nvjpeg_frame
from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.read.samples import Sample
from shardkit.loader.routes.coco.packed import PackedPlanes, PackedTargets
from shardkit.loader.routes.coco.target import BadTarget, coco_target
from shardkit.loader.routes.coco.worker import DetectionBatchBuilder
from shardkit.loader.routes.device.payload import BatchArena, RawImages, WorkerBuffers
from shardkit.loader.stats import StageStats
from shardkit.transforms.detection_geometry import draw_geometry, gpu_unsupported
from shardkit.transforms.gpu import Col, window_geometry

__all__ = ["RawDetectionBatch", "RawDetectionBuilder", "RawMasks"]
@dataclass
class RawMasks:
    """A batch's masks: image ``i``'s uint8 ``[k, h, w]`` planes (in ``planes``), to be resized
    to ``sizes[i]`` and mirrored when ``flips[i]`` on the device (images decoded in the worker
    ship final masks: their own size, no flip)."""

    planes: PackedPlanes
    sizes: list[tuple[int, int]]
    flips: list[bool]


@dataclass
class RawDetectionBatch:
    """What a COCO GPU-route worker ships.

    ``images``: the JPEGs and their geometry rows (``virt_h, virt_w``: each image's output size;
    ``dest``: its position); ``cpu_dest[j]`` is where ``pixels[j]``, an image decoded and
    transformed in the worker, goes (``images.size`` is ``(0, 0)``: those pixels travel beside
    the blob since their sizes differ; ``images.labels`` are unused zeros). ``targets`` and
    ``masks`` (None unless asked for) hold every position's target; ``keys`` and ``stats`` as
    in every route.
    """

    images: RawImages
    pixels: list[torch.Tensor]
    targets: PackedTargets
    masks: RawMasks | None
    keys: list[str]
    stats: StageStats


@dataclass
class _Jpeg:
    data: tuple[int, int] | bytes  # where it lies in the batch's arena, or its bytes
    window: tuple[int, ...]
    target: dict[str, Any]
    masks: torch.Tensor | None


@dataclass
class _Pixels:
    image: torch.Tensor
    target: dict[str, Any]


class RawDetectionBuilder:
    """Turn ``(shard, index, seed)`` triples of COCO samples into a :class:`RawDetectionBatch`.

    Args:
        reader: the dataset's :class:`ShardReader`.
        transform: a detection transform :func:`~shardkit.transforms.detection_geometry.gpu_unsupported`
            accepts (``detection_train``/``detection_val``), or None.
        on_error, masks, label_map: as :class:`~shardkit.loader.routes.coco.worker.DetectionBatchBuilder`'s.
        buffer_cycle: shared-memory buffers per worker process (see
            :class:`~shardkit.loader.routes.device.payload.WorkerBuffers`; 0: a fresh tensor per batch).
        gray: ship grayscale JPEGs encoded too (:func:`~shardkit.codec.nvjpeg.gpu_decodes_gray`).
    Raises:
        LoaderError: a transform the GPU route cannot run (the message says why).
    """

    def __init__(self, reader: ShardReader, transform: Any, *, on_error: str = "replace", masks: bool = False,
                 label_map: dict[Any, int] | None = None, buffer_cycle: int = 0, gray: bool = False) -> None:
        why = gpu_unsupported(transform)
        if why is not None:
            raise LoaderError(f"the COCO GPU route cannot run this transform: {why}")
        self.cpu = DetectionBatchBuilder(reader, transform, on_error=on_error, masks=masks, label_map=label_map)
        self.samples = self.cpu.samples
        self.transform = transform
        self.masks, self.label_map = masks, label_map
        self.buffers = WorkerBuffers(buffer_cycle)
        self.gray = gray

    def _sample(self, sample: Sample, seed: int, stats: StageStats, dstats: DecodeStats,
                arena: BatchArena) -> _Jpeg | _Pixels:
        data = sample.image_buffer()
        frame = nvjpeg_frame(data, gray=self.gray)
        if frame is None:
            return _Pixels(*self.cpu.build_one(sample, seed, stats, dstats))  # exactly the CPU route's step
        t0 = time.perf_counter()
        if "json" not in sample.fields:
            raise BadSample(f"{sample.where}: no json member (has {sample.members()})")
        try:
            height, width = (frame.height, frame.width) if frame.height and frame.width else peek_size(data)
            target = coco_target(sample.fields["json"], height, width, masks=self.masks, label_map=self.label_map)
        except (DecodeError, BadTarget) as err:
            raise BadSample(f"{sample.where}: {err}") from err
        planes = target.pop("masks", None)
        g = draw_geometry(self.transform, height, width, target, seed)
        if planes is not None:
            b = g.box
            planes = planes[g.keep][:, b.top:b.top + b.height, b.left:b.left + b.width].contiguous()
        stats.transform_s += time.perf_counter() - t0
        if sample.image_at is not None:
            arena.keep(sample.image_at[1])
        return _Jpeg(sample.image_at or bytes(data), window_geometry(height, width, g.box, g.size), g.target, planes)

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> RawDetectionBatch:
        """Read the given samples in order; JPEGs stay encoded, the rest are decoded and transformed here."""
        arena = BatchArena(self.buffers, self.samples.span_bytes(shards, indices))
        make: Callable[[int, Sample, int, StageStats, DecodeStats], _Jpeg | _Pixels] = \
            lambda _slot, sample, seed, stats, dstats: self._sample(sample, seed, stats, dstats, arena)  # noqa: E731
        got, stats = self.samples.fill(make, shards, indices, seeds, arena)
        stats.gpu_fallback = stats.fast + stats.fallback  # images decoded here
        items = got.results
        jpegs = [(i, it.data, it.window) for i, it in enumerate(items) if isinstance(it, _Jpeg)]
        cpu = [(i, it.image) for i, it in enumerate(items) if isinstance(it, _Pixels)]
        raw = arena.lay_out(jpegs, [(i, None) for i, _ in cpu], np.zeros(len(items), dtype=np.int64), (0, 0))
        targets = [it.target for it in items]
        return RawDetectionBatch(raw, [px for _, px in cpu], PackedTargets.of(targets),
                                 self._masks(items) if self.masks else None, got.keys, stats)

    @staticmethod
    def _masks(items: list[_Jpeg | _Pixels]) -> RawMasks:
        planes, sizes, flips = [], [], []
        for it in items:
            if isinstance(it, _Jpeg):
                planes.append(it.masks if it.masks is not None else torch.zeros((0, 0, 0), dtype=torch.uint8))
                sizes.append((it.window[Col.VIRT_H], it.window[Col.VIRT_W]))
                flips.append(bool(it.window[Col.FLIP]))
            else:  # transformed in the worker: final already
                m = it.target["masks"]
                planes.append(m)
                sizes.append((int(m.shape[-2]), int(m.shape[-1])))
                flips.append(False)
        return RawMasks(PackedPlanes.of(planes), sizes, flips)
