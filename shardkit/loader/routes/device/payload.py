"""What a device route's worker ships: one shared-memory blob per batch, JPEG bytes beside pixels.

Shared-memory reuse, the *buffer cycle*: in a worker process the JPEG bytes of batch ``k`` go into
buffer ``k % cycle`` of a small per-worker cycle of shared-memory tensors (:class:`BufferCycle`),
so the receiving process, which maps each buffer once (it is shipped there once:
:mod:`~shardkit.loader.routes.reused`), copies from already-mapped pages instead of faulting in a
fresh segment per batch. Why reuse is safe, for ``cycle >= prefetch + 1`` (we use
``prefetch + 2``): torch's DataLoader sends a worker the task for its batch ``j`` only when the
main process takes that worker's batch ``j - prefetch``; the prefetcher stages (copies out of
shared memory) batches in order before taking the next, so by then batch ``j - prefetch - 1``
and all earlier ones have been copied, and buffer ``j % cycle`` last held batch ``j - cycle``,
one of those.

*Reading in place* (:class:`BatchArena`): a worker may read each sample's span (its tar members
with their headers) straight into the blob's JPEG region, and point at the JPEG inside it, instead
of reading it into a ``bytes`` and copying it into the blob afterwards: one copy of each JPEG
instead of three (the read, the tar member, the blob). So the JPEGs need not lie end to end:
``spans`` gives each one's start and end, and the gaps between them (tar headers, the other
members) travel too (a few percent of the bytes).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardkit.loader.routes.reused import cycle_number, forget_reused, is_receiving, received, reused_segment
from shardkit.loader.routes.segments import segment_view
from shardkit.loader.stats import StageStats
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["BatchArena", "BufferCycle", "RawImages", "StagedBatch", "WorkerBuffers"]


_TOKENS = itertools.count()


def _token() -> str:
    """A name for a receiving loader, unique beyond this process: a process elsewhere with the same
    pid (a container's) may have made a builder that is unpickled here."""
    return f"{os.getpid()}-{next(_TOKENS)}-{os.urandom(4).hex()}"


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass
class RawImages:
    """A batch's images before the device: JPEG bytes for nvJPEG and pixels decoded on the CPU.

    Everything lives in one uint8 ``blob`` (one shared-memory handle per batch: each tensor sent
    between processes costs a file-descriptor round trip), laid out as ``nbytes`` of data holding
    the JPEGs, then int64 ``spans`` (``[k, 2]``), ``cpu_dest`` (``m``) and ``labels`` (``n``), int32
    ``geometry`` (``[k, len(GEOMETRY_COLUMNS)]``), uint8 ``cpu_images`` (``[m, 3, *size]``).
    ``data[spans[i, 0]:spans[i, 1]]`` is the i-th GPU image's JPEG and ``geometry[i]`` its crop
    row (``dest``: its position in the batch); ``cpu_images[j]`` goes to position ``cpu_dest[j]``.
    """

    blob: torch.Tensor
    k: int
    m: int
    n: int
    nbytes: int
    size: tuple[int, int]

    @staticmethod
    def blob_size(nbytes: int, k: int, m: int, n: int, size: tuple[int, int]) -> int:
        return _align(nbytes) + 8 * (2 * k + m + n) + _align(4 * len(GEOMETRY_COLUMNS) * k) + m * 3 * size[0] * size[1]

    def _starts(self) -> tuple[int, int, int, int, int]:
        """Where ``spans``, ``cpu_dest``, ``labels``, ``geometry`` and ``cpu_images`` start in the blob."""
        spans = _align(self.nbytes)
        cpu_dest = spans + 16 * self.k
        labels = cpu_dest + 8 * self.m
        geometry = labels + 8 * self.n
        return spans, cpu_dest, labels, geometry, geometry + _align(4 * len(GEOMETRY_COLUMNS) * self.k)

    def _part(self, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        width = torch.empty(0, dtype=dtype).element_size()
        return self.blob[start:start + count * width].view(dtype)

    @property
    def data(self) -> torch.Tensor:
        return self.blob[:self.nbytes]

    @property
    def spans(self) -> torch.Tensor:
        return self._part(self._starts()[0], 2 * self.k, torch.int64).view(self.k, 2)

    @property
    def cpu_dest(self) -> torch.Tensor:
        return self._part(self._starts()[1], self.m, torch.int64)

    @property
    def labels(self) -> torch.Tensor:
        return self._part(self._starts()[2], self.n, torch.int64)

    @property
    def geometry(self) -> torch.Tensor:
        columns = len(GEOMETRY_COLUMNS)
        return self._part(self._starts()[3], columns * self.k, torch.int32).view(self.k, columns)

    @property
    def cpu_images(self) -> torch.Tensor:
        pixels = self.m * 3 * self.size[0] * self.size[1]
        return self._part(self._starts()[4], pixels, torch.uint8).view(self.m, 3, *self.size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """numpy views of ``data``, ``spans``, ``cpu_dest``, ``labels`` and ``geometry`` (what a
        worker writes: one torch call for all, where the properties above make several each)."""
        blob = self.blob.numpy()
        spans, cpu_dest, labels, geometry, _ = self._starts()
        return (blob[:self.nbytes],
                blob[spans:spans + 16 * self.k].view(np.int64).reshape(self.k, 2),
                blob[cpu_dest:cpu_dest + 8 * self.m].view(np.int64),
                blob[labels:labels + 8 * self.n].view(np.int64),
                blob[geometry:geometry + 4 * len(GEOMETRY_COLUMNS) * self.k].view(np.int32).reshape(
                    self.k, len(GEOMETRY_COLUMNS)))

    def __len__(self) -> int:
        return self.n

    def jpegs(self) -> list[torch.Tensor]:
        """Views of ``data``, one 1-D uint8 tensor per GPU image."""
        return [self.data[start:end] for start, end in self.spans.tolist()]


class StagedBatch(Protocol):
    """What a device route's worker ships and a :class:`~shardkit.loader.routes.device.pinned.PinnedSlot`
    stages: the batch's :class:`RawImages`, sample ``keys`` and the worker's ``stats``."""

    images: RawImages
    keys: list[str]
    stats: StageStats


class BufferCycle:
    """Per-process shared-memory byte buffers, reused round-robin (see the module doc), for the
    loader ``token`` names: each is shipped to it once (:mod:`~shardkit.loader.routes.reused`)."""

    def __init__(self, size: int, token: str) -> None:
        self.pid, self.bufs, self.next = os.getpid(), [torch.empty(0, dtype=torch.uint8)] * size, 0
        self.token, self.number = token, cycle_number()

    def take(self, nbytes: int) -> torch.Tensor:
        """The next buffer, whole (at least ``nbytes``; grown to 5/4 of a need it cannot hold)."""
        k = self.next % len(self.bufs)
        self.next += 1
        if self.bufs[k].numel() < nbytes:
            self._replace(k, max(nbytes * 5 // 4, 1 << 20))
        return self.bufs[k]

    def grow(self, nbytes: int, keep: int) -> torch.Tensor:
        """The buffer :meth:`take` last gave, replaced by one of at least ``nbytes`` holding its
        first ``keep`` bytes."""
        k = (self.next - 1) % len(self.bufs)
        old = self.bufs[k]
        self._replace(k, max(nbytes * 5 // 4, 1 << 20))
        self.bufs[k][:keep].copy_(old[:keep])
        return self.bufs[k]

    def _replace(self, k: int, nbytes: int) -> None:
        if self.bufs[k].numel():
            forget_reused(self.bufs[k].untyped_storage())
        self.bufs[k] = _shared(nbytes, self.token, self.number, k)


def _shared(nbytes: int, token: str, cycle: int, index: int) -> torch.Tensor:
    """``nbytes`` of shared memory that torch ships by descriptor: on Linux a memfd segment, which
    the size of /dev/shm does not bound, shipped to the loader ``token`` names once (buffer
    ``index`` of this process's buffer cycle ``cycle``). Under the
    ``file_system`` strategy a named one in /dev/shm from the start (torch would move a segment
    there as it first ships it, swapping the memory under any view of it)."""
    if torch.multiprocessing.get_sharing_strategy() == "file_system":
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()
    return segment_view(reused_segment(nbytes, token, cycle, index), (nbytes,))


class WorkerBuffers:
    """Where a builder puts a batch's blob: in a worker process, the next buffer of that
    process's :class:`BufferCycle` of ``cycle`` buffers (made on first use); elsewhere, or with
    ``cycle=0``, a fresh tensor. Pickles without its buffers (each process makes its own). In the
    process that receives the batches it holds their buffers' mappings
    (:func:`~shardkit.loader.routes.reused.received`), as every copy of it does."""

    def __init__(self, cycle: int) -> None:
        self.cycle = cycle
        self.token = _token()
        self._buffers: BufferCycle | None = None
        self._received = received(self.token)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_buffers": None, "_received": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        if get_worker_info() is None and is_receiving(self.token):
            # a copy beside the loader it copies (a deep-copied or unpickled loader): its workers
            # ship to it under a token of its own, and their start leaves the original's mappings
            self.token = _token()
        self._received = received(self.token)

    def let_go(self) -> None:
        """Receiving side: drop the mappings of the buffers received so far (the workers stopped,
        or new ones are about to start and would inherit them)."""
        self._received.clear()

    def _cycle(self) -> BufferCycle | None:
        if self.cycle <= 0 or get_worker_info() is None:
            return None
        if self._buffers is None or self._buffers.pid != os.getpid():
            self._buffers = BufferCycle(self.cycle, self.token)
        return self._buffers

    def take(self, nbytes: int) -> torch.Tensor:
        """A buffer for the next batch: at least ``nbytes``, maybe more."""
        cycle = self._cycle()
        return torch.empty(nbytes, dtype=torch.uint8) if cycle is None else cycle.take(nbytes)

    def grow(self, buffer: torch.Tensor, nbytes: int, keep: int) -> torch.Tensor:
        """``buffer`` (the last :meth:`take`) replaced by one of at least ``nbytes`` holding its
        first ``keep`` bytes."""
        cycle = self._cycle()
        if cycle is not None:
            return cycle.grow(nbytes, keep)
        bigger = torch.empty(nbytes, dtype=torch.uint8)
        bigger[:keep].copy_(buffer[:keep])
        return bigger


class BatchArena:
    """A batch's blob while its worker reads samples straight into it (see the module doc).

    Made with room for the spans the batch plans to read (``capacity`` bytes). :meth:`reserve`
    hands out the room after the bytes kept so far, :meth:`keep` keeps some of it; room reserved
    and not kept is handed out again (a sample whose JPEG does not stay there: decoded on the CPU,
    bad, cut into a piece). :meth:`lay_out` then writes the rest of the batch after what is kept.
    """

    def __init__(self, buffers: WorkerBuffers, capacity: int) -> None:
        self.buffers = buffers
        self.capacity = capacity
        self.buffer = buffers.take(capacity)
        self.view = memoryview(self.buffer.numpy().data)
        self.end = 0  # bytes kept so far

    def reserve(self, size: int) -> tuple[int, memoryview] | None:
        """``(start, room)`` for a span of ``size`` bytes after those kept, or None where the
        planned room is used up (a replacement sample beyond the batch's plan)."""
        if self.end + size > self.capacity:
            return None
        return self.end, self.view[self.end:self.end + size]

    def keep(self, end: int) -> None:
        """Keep the bytes up to ``end`` (inside the room reserved last)."""
        self.end = end

    def write(self, start: int, data: bytes) -> None:
        """Put ``data`` at ``start`` (inside the room reserved last: a JPEG cut shorter)."""
        self.view[start:start + len(data)] = data

    def lay_out(self, jpegs: Sequence[tuple[int, tuple[int, int] | bytes, tuple[int, ...]]],
                cpu: Sequence[tuple[int, torch.Tensor | None]], labels: np.ndarray,
                size: tuple[int, int]) -> RawImages:
        """The batch's :class:`RawImages`: ``jpegs`` as ``(dest, (start, end) kept here or bytes,
        window)``, the bytes copied in after what is kept; ``cpu`` as ``(dest, pixels)`` (pixels of
        ``size``, or None where they travel beside the blob, ``size`` then ``(0, 0)``: the detection
        route's images differ in size); ``labels`` one per image. An arena of no room lays the
        JPEGs end to end."""
        nbytes = self.end + sum(len(d) for _, d, _ in jpegs if isinstance(d, bytes))
        want = RawImages.blob_size(nbytes, len(jpegs), len(cpu), len(labels), size)
        if want > self.buffer.numel():
            self.buffer = self.buffers.grow(self.buffer, want, self.end)
        raw = RawImages(self.buffer[:want], len(jpegs), len(cpu), len(labels), nbytes, size)
        data, spans, cpu_dest, rows_labels, geometry = raw.arrays()
        pos, rows = self.end, []
        for _, d, _ in jpegs:
            if isinstance(d, bytes):
                data[pos:pos + len(d)] = np.frombuffer(d, dtype=np.uint8)
                rows.append((pos, pos + len(d)))
                pos += len(d)
            else:
                rows.append(d)
        if rows:
            spans[:] = rows
            geometry[:] = [(*win, i) for i, _, win in jpegs]
        cpu_dest[:] = [i for i, _ in cpu]
        rows_labels[:] = labels
        if any(px is not None for _, px in cpu):
            images = raw.cpu_images
            for j, (_, px) in enumerate(cpu):
                if px is not None:
                    images[j].copy_(px)
        return raw
