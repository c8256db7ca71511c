"""The GPU route's worker half: ship raw JPEG bytes plus crop geometry instead of pixels.

For each sample the worker reads the image size from the header, draws the crop/flip from the
sample's seed as the CPU route does (:meth:`~shardkit.transforms.base.ImageTransform.draw`, so
both routes crop and flip every sample alike) and ships the encoded bytes (of a restart-indexed
JPEG, only the restart intervals around a crop-first transform's box:
:func:`~shardkit.codec.jpeg_restart.cut`) with one row of geometry
(:data:`~shardkit.transforms.gpu.GEOMETRY_COLUMNS`). Images nvJPEG cannot take
(:func:`~shardkit.codec.nvjpeg.nvjpeg_friendly`; grayscale JPEGs only where the route found that
the device decodes them as the CPU route does, ``gray``) are decoded and transformed here,
exactly as the CPU route does, and travel as pixels to be joined into the same batch on the device.

The batch travels as one :class:`~shardkit.loader.routes.device.payload.RawImages` blob
(:mod:`~shardkit.loader.routes.device.payload`, shared with the COCO GPU route). Each sample is
read straight into that blob (a :class:`~shardkit.loader.routes.device.payload.BatchArena` with
room for the batch's planned spans) and its JPEG left where it landed; a JPEG cut to its restart
intervals is written back over its own span, and only what does not fit there (a replacement
beyond the plan, a span the plain tar parser does not take) is copied in after the rest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.codec import jpeg_restart
from shardkit.codec.decode import DecodeStats, peek_size
from shardkit.codec.nvjpeg import nvjpeg_frame
from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.read.samples import Sample, SampleSource, decode_for
from shardkit.loader.routes.device.payload import BatchArena, RawImages, WorkerBuffers
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform

__all__ = ["RawBatch", "RawBatchBuilder"]

#: A JPEG (its ``(start, end)`` in the batch's arena, or its bytes) and its geometry row, or pixels and None.
Item = tuple[tuple[int, int] | bytes | torch.Tensor, tuple[int, ...] | None]


@dataclass
class RawBatch:
    """What a GPU-route worker ships: the batch's :class:`RawImages` (labels included), sample
    ``keys`` and the worker's ``stats``; for captioned images, ``texts``, the batch's text
    (:class:`~shardkit.loader.read.captions.CaptionTargets`), while the payload's labels are the
    rows ``0..n-1``: the host moves them with the images it replaces, and the text rows after them."""

    images: RawImages
    keys: list[str]
    stats: StageStats
    texts: Any = None


class RawBatchBuilder:
    """Turn ``(shard, index, seed)`` triples into a :class:`RawBatch` (needs an ImageTransform).

    ``buffer_cycle``: shared-memory buffers per worker process for JPEG bytes (0: a fresh tensor
    per batch); must be at least the DataLoader's ``prefetch_factor + 1`` (see the module doc; the
    route uses ``+ 2``). ``gray``: ship grayscale JPEGs encoded too
    (:func:`~shardkit.codec.nvjpeg.gpu_decodes_gray`), instead of decoding them here.
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform, *, on_error: str = "replace",
                 buffer_cycle: int = 0, num_classes: int | None = None,
                 captions: CaptionTargets | None = None, gray: bool = False) -> None:
        if not isinstance(transform, ImageTransform):
            raise LoaderError("the GPU route needs an ImageTransform (e.g. transforms.imagenet_train(224))")
        self.samples = SampleSource(reader, on_error, num_classes)
        self.transform = transform
        self.buffer_cycle = buffer_cycle
        self.buffers = WorkerBuffers(buffer_cycle)
        self.captions = captions
        self.gray = gray

    def _raw(self, sample: Sample, seed: int, stats: StageStats, dstats: DecodeStats,
             arena: BatchArena) -> tuple[Any, Item]:
        t1 = time.perf_counter()
        label: Any = (sample.label(self.samples.num_classes) if self.captions is None
                      else self.captions.read(sample))
        data = sample.image_buffer()
        transform = self.transform
        frame = nvjpeg_frame(data, gray=self.gray)
        if frame is not None:
            try:
                h, w = (frame.height, frame.width) if frame.height and frame.width else peek_size(data)
                params = transform.draw(h, w, seed)
                piece = jpeg_restart.cut(data, params.top, params.left, params.height, params.width) \
                    if transform.crop_first else None
            except DecodeError as err:
                raise BadSample(str(err)) from err
            at = sample.image_at
            if piece is not None:  # nvJPEG decodes only the restart intervals around the crop
                h, w = piece.height, piece.width
                params = params._replace(top=params.top - piece.top, left=params.left - piece.left)
                if at is not None and len(piece.data) <= at[1] - at[0]:  # over its own span
                    arena.write(at[0], piece.data)
                    at = (at[0], at[0] + len(piece.data))
                else:
                    at, data = None, piece.data
            if at is not None:
                arena.keep(at[1])
            stats.transform_s += time.perf_counter() - t1
            return label, (at if at is not None else bytes(data), transform.gpu_window(h, w, params))
        image, params = decode_for(transform, bytes(data), seed, sample.where, dstats)  # as the CPU route does
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        pixels = transform.apply(image, params)
        stats.transform_s += time.perf_counter() - t2
        return label, (pixels, None)

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> RawBatch:
        """Read the given samples in order; JPEGs stay encoded, the rest are decoded here."""
        arena = BatchArena(self.buffers, self.samples.span_bytes(shards, indices))
        got, stats = self.samples.fill(
            lambda _slot, sample, seed, stats, dstats: self._raw(sample, seed, stats, dstats, arena),
            shards, indices, seeds, arena)
        stats.gpu_fallback = stats.fast + stats.fallback
        targets = [label for label, _ in got.results]
        if self.captions is None:
            labels, texts = np.array(targets, dtype=np.int64), None
        else:
            labels, texts = np.arange(len(targets), dtype=np.int64), self.captions.collate(
                targets, f"{self.samples.reader.where(int(shards[got.source(0)]))}:{got.keys[0]}")
        items = [item for _, item in got.results]
        jpegs = [(i, data, win) for i, (data, win) in enumerate(items)
                 if not isinstance(data, torch.Tensor) and win is not None]
        cpu = [(i, px) for i, (px, _win) in enumerate(items) if isinstance(px, torch.Tensor)]
        images = arena.lay_out(jpegs, cpu, labels, self.transform.output_size)
        return RawBatch(images, got.keys, stats, texts)
