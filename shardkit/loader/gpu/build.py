"""The GPU route's worker half: ship raw JPEG bytes plus crop geometry instead of pixels.

For each sample the worker reads the image size from the header, draws the crop/flip from the
same seeded ``random.Random(seed)`` as the CPU route (so both routes crop and flip every sample
alike) and ships the encoded bytes (of a restart-indexed JPEG, only the restart intervals around
a crop-first transform's box: :func:`~shardkit.codec.jpeg_restart.cut`) with one row of geometry
(:data:`~shardkit.transforms.gpu.GEOMETRY_COLUMNS`). Images nvJPEG cannot take
(:func:`~shardkit.codec.nvjpeg.nvjpeg_friendly`) are decoded and transformed here, exactly
as the CPU route does, and travel as pixels to be joined into the same batch on the device.

Shared-memory reuse, the *buffer cycle*: in a worker process the JPEG bytes of batch ``k`` go into
buffer ``k % cycle`` of a small per-worker cycle of shared-memory tensors (:class:`BufferCycle`),
so the main process (which keeps them mapped) copies from already-mapped pages instead of
faulting in a fresh segment per batch. Why reuse is safe, for ``cycle >= prefetch + 1`` (we use
``prefetch + 2``): torch's DataLoader sends a worker the task for its batch ``j`` only when the
main process takes that worker's batch ``j - prefetch``; the prefetcher stages (copies out of
shared memory) batches in order before taking the next, so by then batch ``j - prefetch - 1``
and all earlier ones have been copied, and buffer ``j % cycle`` last held batch ``j - cycle``,
one of those.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardkit.codec import jpeg_restart
from shardkit.codec.decode import DecodeStats, peek_size
from shardkit.codec.nvjpeg import nvjpeg_friendly
from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.bad_samples import BadSample
from shardkit.loader.reader import ShardReader
from shardkit.loader.samples import Sample, SampleSource, decode_for
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["BufferCycle", "RawBatch", "RawBatchBuilder", "RawImages", "StagedBatch", "WorkerBuffers", "pack_raw"]

Item = tuple[bytes | torch.Tensor, tuple[int, ...] | None]  # JPEG bytes + geometry, or pixels + None


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass
class RawImages:
    """A batch's images before the device: JPEG bytes for nvJPEG and pixels decoded on the CPU.

    Everything lives in one uint8 ``blob`` (one shared-memory handle per batch: each tensor sent
    between processes costs a file-descriptor round trip), laid out as JPEG bytes, then int64
    ``bounds`` (``k + 1``), ``cpu_dest`` (``m``) and ``labels`` (``n``), int32 ``geometry``
    (``[k, len(GEOMETRY_COLUMNS)]``), uint8 ``cpu_images`` (``[m, 3, *size]``). ``data[bounds[i]:bounds[i+1]]`` is
    the i-th GPU image's JPEG and ``geometry[i]`` its crop row (``dest``: its position in the
    batch); ``cpu_images[j]`` goes to position ``cpu_dest[j]``.
    """

    blob: torch.Tensor
    k: int
    m: int
    n: int
    nbytes: int
    size: tuple[int, int]

    @staticmethod
    def blob_size(nbytes: int, k: int, m: int, n: int, size: tuple[int, int]) -> int:
        return _align(nbytes) + 8 * (k + 1 + m + n) + _align(4 * len(GEOMETRY_COLUMNS) * k) + m * 3 * size[0] * size[1]

    def _part(self, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        width = torch.empty(0, dtype=dtype).element_size()
        return self.blob[start:start + count * width].view(dtype)

    @property
    def data(self) -> torch.Tensor:
        return self.blob[:self.nbytes]

    @property
    def bounds(self) -> torch.Tensor:
        return self._part(_align(self.nbytes), self.k + 1, torch.int64)

    @property
    def cpu_dest(self) -> torch.Tensor:
        return self._part(_align(self.nbytes) + 8 * (self.k + 1), self.m, torch.int64)

    @property
    def labels(self) -> torch.Tensor:
        return self._part(_align(self.nbytes) + 8 * (self.k + 1 + self.m), self.n, torch.int64)

    @property
    def geometry(self) -> torch.Tensor:
        start = _align(self.nbytes) + 8 * (self.k + 1 + self.m + self.n)
        return self._part(start, len(GEOMETRY_COLUMNS) * self.k, torch.int32).view(self.k, len(GEOMETRY_COLUMNS))

    @property
    def cpu_images(self) -> torch.Tensor:
        start = _align(self.nbytes) + 8 * (self.k + 1 + self.m + self.n) + _align(4 * len(GEOMETRY_COLUMNS) * self.k)
        return self._part(start, self.m * 3 * self.size[0] * self.size[1], torch.uint8).view(self.m, 3, *self.size)

    def __len__(self) -> int:
        return self.n

    def jpegs(self) -> list[torch.Tensor]:
        """Views of ``data``, one 1-D uint8 tensor per GPU image."""
        b = self.bounds.tolist()
        return [self.data[b[i]:b[i + 1]] for i in range(len(b) - 1)]


class StagedBatch(Protocol):
    """What a device route's worker ships and a :class:`~shardkit.loader.gpu.pinned.PinnedSlot`
    stages: the batch's :class:`RawImages`, sample ``keys`` and the worker's ``stats``."""

    images: RawImages
    keys: list[str]
    stats: StageStats


@dataclass
class RawBatch:
    """What a GPU-route worker ships: the batch's :class:`RawImages` (labels included), sample
    ``keys`` and the worker's ``stats``."""

    images: RawImages
    keys: list[str]
    stats: StageStats


class BufferCycle:
    """Per-process shared-memory byte buffers, reused round-robin (see the module doc)."""

    def __init__(self, size: int) -> None:
        self.pid, self.bufs, self.next = os.getpid(), [torch.empty(0, dtype=torch.uint8)] * size, 0

    def take(self, nbytes: int) -> torch.Tensor:
        k = self.next % len(self.bufs)
        self.next += 1
        if self.bufs[k].numel() < nbytes:
            self.bufs[k] = torch.empty(max(nbytes * 5 // 4, 1 << 20), dtype=torch.uint8).share_memory_()
        return self.bufs[k][:nbytes]


class WorkerBuffers:
    """Where a builder puts a batch's blob: in a worker process, the next buffer of that
    process's :class:`BufferCycle` of ``cycle`` buffers (made on first use); elsewhere, or with
    ``cycle=0``, a fresh tensor. Pickles without its buffers (each process makes its own)."""

    def __init__(self, cycle: int) -> None:
        self.cycle = cycle
        self._buffers: BufferCycle | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_buffers": None}

    def take(self, nbytes: int) -> torch.Tensor:
        if self.cycle <= 0 or get_worker_info() is None:
            return torch.empty(nbytes, dtype=torch.uint8)
        if self._buffers is None or self._buffers.pid != os.getpid():
            self._buffers = BufferCycle(self.cycle)
        return self._buffers.take(nbytes)


def pack_raw(buffer: torch.Tensor | WorkerBuffers, jpegs: Sequence[tuple[int, bytes, tuple[int, ...]]],
             cpu: Sequence[tuple[int, torch.Tensor | None]], labels: np.ndarray, size: tuple[int, int]) -> RawImages:
    """Lay a batch out as one :class:`RawImages` blob: ``jpegs`` as ``(dest, bytes, window)``,
    ``cpu`` as ``(dest, pixels)`` (pixels of ``size``, or None where they travel beside the blob,
    ``size`` then ``(0, 0)``: the detection route's images differ in size), ``labels`` one per image."""
    lengths = [len(d) for _, d, _ in jpegs]
    k, m, n, nbytes = len(jpegs), len(cpu), len(labels), sum(lengths)
    want = RawImages.blob_size(nbytes, k, m, n, size)
    blob = buffer.take(want) if isinstance(buffer, WorkerBuffers) else buffer[:want]
    raw = RawImages(blob, k, m, n, nbytes, size)
    view, pos = raw.data.numpy(), 0
    for (_, d, _), length in zip(jpegs, lengths, strict=True):
        view[pos:pos + length] = np.frombuffer(d, dtype=np.uint8)
        pos += length
    raw.bounds.numpy()[:] = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    raw.cpu_dest.numpy()[:] = [i for i, _ in cpu]
    raw.labels.numpy()[:] = labels
    if k:
        raw.geometry.numpy()[:] = [(*win, i) for i, _, win in jpegs]
    for j, (_, px) in enumerate(cpu):
        if px is not None:
            raw.cpu_images[j].copy_(px)
    return raw


class RawBatchBuilder:
    """Turn ``(shard, index, seed)`` triples into a :class:`RawBatch` (needs an ImageTransform).

    ``buffer_cycle``: shared-memory buffers per worker process for JPEG bytes (0: a fresh tensor
    per batch); must be at least the DataLoader's ``prefetch_factor + 1`` (see the module doc; the
    route uses ``+ 2``).
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform, *, on_error: str = "replace",
                 buffer_cycle: int = 0, num_classes: int | None = None) -> None:
        if not isinstance(transform, ImageTransform):
            raise LoaderError("the GPU route needs an ImageTransform (e.g. transforms.imagenet_train(224))")
        self.samples = SampleSource(reader, on_error, num_classes)
        self.transform = transform
        self.buffer_cycle = buffer_cycle
        self.buffers = WorkerBuffers(buffer_cycle)

    def _raw(self, sample: Sample, seed: int, stats: StageStats, dstats: DecodeStats) -> tuple[int, Item]:
        t1 = time.perf_counter()
        label, data = sample.label(self.samples.num_classes), sample.image()
        transform = self.transform
        rng = random.Random(seed)
        if nvjpeg_friendly(data):
            try:
                h, w = peek_size(data)
                params = transform.sample_params(h, w, rng)
                piece = jpeg_restart.cut(data, params.top, params.left, params.height, params.width) \
                    if transform.crop_first else None
            except DecodeError as err:
                raise BadSample(str(err)) from err
            if piece is not None:  # nvJPEG decodes only the restart intervals around the crop
                data, h, w = piece.data, piece.height, piece.width
                params = replace(params, top=params.top - piece.top, left=params.left - piece.left)
            stats.transform_s += time.perf_counter() - t1
            return label, (data, transform.gpu_window(h, w, params))
        image, params = decode_for(transform, data, rng, sample.where, dstats)  # as the CPU route does
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        pixels = transform.apply(image, params)
        stats.transform_s += time.perf_counter() - t2
        return label, (pixels, None)

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> RawBatch:
        """Read the given samples in order; JPEGs stay encoded, the rest are decoded here."""
        got, stats = self.samples.fill(
            lambda _slot, sample, seed, stats, dstats: self._raw(sample, seed, stats, dstats), shards, indices, seeds)
        stats.gpu_fallback = stats.fast + stats.fallback
        labels = np.array([label for label, _ in got.results], dtype=np.int64)
        return RawBatch(self._pack([item for _, item in got.results], labels), got.keys, stats)

    def _pack(self, items: list[Item], labels: np.ndarray) -> RawImages:
        jpegs = [(i, data, win) for i, (data, win) in enumerate(items)
                 if not isinstance(data, torch.Tensor) and win is not None]
        cpu = [(i, px) for i, (px, _win) in enumerate(items) if isinstance(px, torch.Tensor)]
        return pack_raw(self.buffers, jpegs, cpu, labels, self.transform.output_size)
