"""What a device route's worker ships: one shared-memory blob per batch, JPEG bytes beside pixels.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardkit.loader.stats import StageStats
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["BufferCycle", "RawImages", "StagedBatch", "WorkerBuffers", "pack_raw"]


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
    """What a device route's worker ships and a :class:`~shardkit.loader.routes.device.pinned.PinnedSlot`
    stages: the batch's :class:`RawImages`, sample ``keys`` and the worker's ``stats``."""

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
