"""The CPU route's shared batch pool: batch tensors that workers fill and the main process
reads in place, each slot reused once the consumer has dropped every view of it.

Handing a freshly allocated batch tensor from a DataLoader worker to the main process costs a
new shared-memory segment per batch: created, page-faulted and zero-filled in the worker, passed
as a file descriptor, mapped and faulted again in the main process, unmapped when dropped. For a
64 x 3 x 224 x 224 uint8 batch that is ~11 ms of CPU (~0.17 ms per image, measured on the 2-core
bench box: docs/performance.md), about a tenth of the whole per-image cost of the CPU route.

A :class:`SharedBatchPool` instead gives each worker a few slots, each one shared-memory segment of a
full batch. A worker fills a free slot and ships only a :class:`SlotImages` reference (the
segment itself travels once, with the slot's first batch). Unpickling that reference in the
main process yields a tensor over the slot's memory, no copy. The slot is free again when the
last tensor or view on it is garbage collected.

Why reuse is safe: ``busy[slot]`` has one writer per transition. The worker sets it to 1
before writing pixels into a slot whose flag it read as 0; the main process sets it back to 0
only once nothing references the slot's memory any more (the tensor handed out holds the buffer
object a weak reference watches; every view holds that tensor's storage). A worker that finds
none of its slots free allocates a fresh segment as before, so a consumer that keeps many
batches alive only loses the speed-up, never data.

No Python code runs where a buffer dies: its weak reference's callback is ``list.append`` of the
pool's list of dead references, which runs in C, and the flags are cleared from that list when
the main process next takes a batch, whether it came in a slot or not, or reclaims the pool
(:meth:`SharedBatchPool.collect`). A slot is therefore free one batch later than its tensor
died: a consumer that holds on to a batch or two besides the one in hand leaves its workers
fewer free slots than before (they then allocate, never wait). A finaliser in Python ran
wherever the consumer dropped a batch, and a Ctrl-C landing in it was lost (Python reports an
exception raised in a finaliser and goes on): the loop ran on, and then failed on finding its
workers, which had the same SIGINT, gone.

Slots that never reach the main process are given back too: a worker whose batch fails
releases its slot, and :meth:`SharedBatchPool.reclaim` frees every slot no delivered tensor holds
once no worker runs (torch drops in-flight batches unread when it stops workers). A pool is
tied to the process that created it: a copy (a pickled loader in another process, or a deep
copy) must not share its flags, so the CPU route makes the copy a pool of its own
(:meth:`SharedBatchPool.owned`, :meth:`SharedBatchPool.fresh`) before it starts workers.

Nothing in /dev/shm: slots, flags and the batches a worker makes when no slot is free
(:class:`FdImages`) are segments without a name (:mod:`~shardkit.loader.routes.segments`: on
Linux memfd files, which the size of /dev/shm does not bound), shipped as file descriptors,
whatever ``torch.multiprocessing``'s sharing strategy. With the
``file_system`` strategy torch names each segment after its maker (``/dev/shm/torch_<pid>_...``),
and every worker start left its slots in /dev/shm until the main process exited.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import weakref
from typing import Any

import torch

from shardkit.errors import LoaderError
from shardkit.loader.routes.segments import attach, descriptor, segment_view, shared_segment

__all__ = ["FdImages", "SharedBatchPool", "SlotImages"]

_POOLS: weakref.WeakValueDictionary[str, SharedBatchPool] = weakref.WeakValueDictionary()
"""The pools this process created (the main process), by token: where slot references land."""
_TOKENS = itertools.count()


_MEMORY_TYPES: dict[int, type[ctypes.Array[ctypes.c_uint8]]] = {}


def _memory_type(nbytes: int) -> type[ctypes.Array[ctypes.c_uint8]]:
    """The type of the objects exposing ``nbytes`` of a slot to :func:`torch.frombuffer`: a
    Python subclass of a ctypes array, so it takes a weakref and an attribute."""
    kind = _MEMORY_TYPES.get(nbytes)
    if kind is None:
        kind = _MEMORY_TYPES[nbytes] = type(f"_SlotMemory{nbytes}", (ctypes.c_uint8 * nbytes,), {})
    return kind


class SharedBatchPool:
    """``slots_per_worker`` reusable shared-memory batches of ``shape`` for each of ``num_workers``.

    Create it in the main process before the workers start (it travels to them inside the
    dataset); workers call :meth:`acquire`; the main process receives tensors transparently.

    Example::

        pool = SharedBatchPool(num_workers=2, slots_per_worker=4, shape=(64, 3, 224, 224))
        # in worker w:  out, images = pool.acquire(w, n)  -> fill out[:n], ship ``images``
    """

    def __init__(self, *, num_workers: int, slots_per_worker: int, shape: tuple[int, ...]) -> None:
        if num_workers < 1 or slots_per_worker < 1 or min(shape) < 1:
            raise ValueError(f"need num_workers, slots_per_worker and shape >= 1, got {num_workers}, "
                             f"{slots_per_worker}, {shape}")
        self.token = f"{os.getpid()}-{next(_TOKENS)}-{os.urandom(4).hex()}"  # unique beyond this pid (containers)
        self.slots_per_worker = slots_per_worker
        self.shape = shape
        flags = num_workers * slots_per_worker
        self.busy = segment_view(shared_segment(flags), (flags,))
        # Worker side, filled lazily: this process's segment per slot and whether it was shipped.
        self._segments: dict[int, torch.UntypedStorage] = {}
        self._shipped: set[int] = set()
        # Main side: the segment each slot was last shipped with, the slots a delivered tensor
        # still holds, the weak reference watching each one's buffer (by id: a buffer is not
        # hashable), and those found dead since the last collect().
        self._received: dict[int, torch.UntypedStorage] = {}
        self._live: set[int] = set()
        self._watched: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._dead: list[weakref.ref[Any]] = []
        _POOLS[self.token] = self

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self.token, "slots_per_worker": self.slots_per_worker, "shape": self.shape,
                "busy": self.busy, "_segments": {}, "_shipped": set(), "_received": {}, "_live": set(),
                "_watched": {}, "_dead": []}

    def owned(self) -> bool:
        """Whether this is the pool its token was created for, in this process (not a copy)."""
        return _POOLS.get(self.token) is self

    def fresh(self) -> SharedBatchPool:
        """A new pool of the same geometry, with flags and slots of its own."""
        return SharedBatchPool(num_workers=self.busy.numel() // self.slots_per_worker,
                         slots_per_worker=self.slots_per_worker, shape=self.shape)

    def reclaim(self) -> None:
        """Main process, while no worker runs: free every slot that no delivered tensor holds
        (batches in flight when workers stopped were dropped unread), and unmap their segments
        (the next workers ship new ones)."""
        self.collect()
        for slot in range(self.busy.numel()):
            if slot not in self._live:
                self.busy[slot] = 0
                self._received.pop(slot, None)

    def collect(self) -> None:
        """Main process: free the slots whose delivered tensors (and every view of them) have been
        dropped since the last call. The route calls it for every batch taken (one that came in a
        fresh segment too), and :meth:`reclaim` does."""
        while True:  # the route's thread and a pin-memory thread may both collect: each pop is one thread's
            try:
                dead = self._dead.pop()
            except IndexError:
                return
            _, slot = self._watched.pop(id(dead))
            self._live.discard(slot)
            self.busy[slot] = 0

    def _watch(self, memory: object, slot: int) -> None:
        """Main process: ``slot`` is held until ``memory``, the buffer under its delivered tensor, dies."""
        self.collect()
        self._live.add(slot)
        watch = weakref.ref(memory, self._dead.append)
        self._watched[id(watch)] = (watch, slot)

    @property
    def slot_bytes(self) -> int:
        return math.prod(self.shape)

    def acquire(self, worker: int, n: int) -> tuple[torch.Tensor, SlotImages] | None:
        """A free slot of ``worker`` as ``(uint8 [n, *shape[1:]] tensor to fill, reference to
        ship)``, or ``None`` when all its slots are still in use (allocate a fresh buffer)."""
        if not 0 < n <= self.shape[0]:
            raise ValueError(f"batch of {n} does not fit slots of {self.shape[0]}")
        busy = self.busy.numpy()
        first = worker * self.slots_per_worker
        for slot in range(first, first + self.slots_per_worker):
            if busy[slot] == 0:
                break
        else:
            return None
        busy[slot] = 1
        segment = self._segments.get(slot)
        if segment is None:
            segment = self._segments[slot] = shared_segment(self.slot_bytes)
        shape = (n, *self.shape[1:])
        return segment_view(segment, shape), SlotImages(self, slot, shape)

    def _ship(self, slot: int) -> torch.UntypedStorage | None:
        """The slot's segment the first time it is shipped from this process, else ``None``."""
        if slot in self._shipped:
            return None
        self._shipped.add(slot)
        return self._segments[slot]


class SlotImages:
    """A worker's filled slot on its way to the main process, where unpickling makes it a
    uint8 tensor of ``shape`` over the slot's memory (see :class:`SharedBatchPool`)."""

    def __init__(self, pool: SharedBatchPool, slot: int, shape: tuple[int, ...]) -> None:
        self.pool, self.slot, self.shape = pool, slot, shape

    def __reduce__(self) -> tuple[Any, ...]:
        segment = self.pool._ship(self.slot)
        return _receive, (self.pool.token, self.slot, self.shape, None if segment is None else descriptor(segment))

    def release(self) -> None:
        """Worker side: give the slot back unshipped (its batch failed)."""
        self.pool.busy[self.slot] = 0

    def unsent(self) -> None:
        """Worker side: the batch was being pickled and failed: the slot is free again, and its
        segment goes with the next batch that fills it (the main process may not have it)."""
        self.pool._shipped.discard(self.slot)
        self.release()


class FdImages:
    """A worker's batch in a segment of its own (no slot of the pool was free), on its way to the
    main process as a file descriptor; unpickled, a uint8 tensor of ``shape`` over it."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.segment = shared_segment(math.prod(shape))
        self.images = segment_view(self.segment, shape)

    def __reduce__(self) -> tuple[Any, ...]:
        return _receive_own, (self.shape, descriptor(self.segment))

    def release(self) -> None:
        """Nothing to give back (the segment goes with the last tensor on it)."""


def _receive_own(shape: tuple[int, ...], shipped: tuple[Any, int]) -> torch.Tensor:
    return segment_view(attach(shipped), shape)


def _receive(token: str, slot: int, shape: tuple[int, ...], shipped: tuple[Any, int] | None) -> torch.Tensor:
    pool = _POOLS.get(token)
    if pool is None:
        raise LoaderError(f"a worker sent a batch for pool {token}, which this process does not hold")
    if shipped is not None:
        pool._received[slot] = attach(shipped)
    segment = pool._received.get(slot)
    if segment is None:
        raise LoaderError(f"a worker sent slot {slot} of pool {token} before its shared-memory segment")
    nbytes = math.prod(shape)
    memory = _memory_type(nbytes).from_address(segment.data_ptr())
    memory.segment = segment  # type: ignore[attr-defined]  # the mapping lives as long as any view
    pool._watch(memory, slot)
    return torch.frombuffer(memory, dtype=torch.uint8).view(shape)
