"""Segments a worker refills batch after batch, shipped to the receiving process once.

A device route's worker writes each batch into one of a few shared-memory buffers of its own, in
turn (:class:`~shardkit.loader.routes.device.payload.BufferCycle`). Shipped as torch ships a tensor,
every batch would send its buffer's file descriptor again: a connection to the worker's
``multiprocessing`` resource-sharer thread, two authentication challenges and the descriptor, in
both processes (about 0.3 ms of the worker's CPU and 0.4 ms of the receiver's a batch on the 2-core
box, docs/performance.md), and the receiver maps the segment again wherever nothing of it was
still alive there (a fault per page read).

Here a buffer travels as its descriptor the first time it is shipped and as a key afterwards; the
receiving process keeps the mapping in a :class:`Received` that the loader's own copy of the
builder holds (:func:`received`), so the mappings go with the loader, never outlive it. Only the
loader's own worker processes ship this way (their batches go through
:class:`~shardkit.loader.run.stream.Shipped`, whose pickler asks :func:`reduce_reused`); a batch
pickled any other way carries its tensors as torch does.

A key names the receiving loader (its token), the worker process and the buffer: a worker started
later (a replacement) ships its own buffers under keys of its own, and a bigger segment that
replaces a buffer ships under the buffer's key, replacing the mapping. The receiver drops its
mappings when the loader stops its workers and before it starts new ones (which would inherit
them: a forked child drops what its parent received), and those of worker processes that have
ended whenever a new buffer comes.
Reusing a buffer is safe for the reasons the buffer cycle gives (the receiver has copied a batch
out before the worker writes the buffer again): the receiver's mapping is the same memory the
worker writes, as it was when torch mapped it anew for each batch.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from shardkit._compat import fd_storage_descriptor
from shardkit.errors import LoaderError
from shardkit.loader.routes.segments import attach, descriptor, shared_segment

__all__ = ["Received", "cycle_number", "forget_reused", "is_receiving", "received", "reduce_reused", "reused_segment",
           "unship"]

#: (receiving loader's token, maker's pid, its buffer cycle, the buffer's place in it): what names a
#: reused segment between processes. A bigger segment that replaces a buffer takes over its key.
Key = tuple[str, int, int, int]


@dataclass
class _Reused:
    key: Key
    file: tuple[int, int]  # (st_dev, st_ino) of the segment's file: what tells it from memory at its old address
    shipped: bool = False


def _file(storage: torch.UntypedStorage) -> tuple[int, int] | None:
    """The identity of the shared-memory file behind ``storage``, or None where it has none."""
    if not storage.is_shared():
        return None
    try:
        st = os.fstat(fd_storage_descriptor(storage)[0])
    except (RuntimeError, OSError):  # shared by name (the file_system strategy), or gone
        return None
    return st.st_dev, st.st_ino


_REUSED: dict[int, _Reused] = {}  # this process's reused segments, by the address of their memory
_CYCLES = itertools.count()


def cycle_number() -> int:
    """A number for a new buffer cycle of this process (its buffers' keys hold it)."""
    return next(_CYCLES)


def reused_segment(nbytes: int, token: str, cycle: int, index: int) -> torch.UntypedStorage:
    """A :func:`~shardkit.loader.routes.segments.shared_segment` of ``nbytes`` that this process
    refills batch after batch for the loader ``token`` names, as buffer ``index`` of its buffer
    cycle ``cycle`` (:func:`cycle_number`); :func:`forget_reused` it before dropping it. Shipped,
    it replaces the buffer's earlier segment in the receiving process."""
    segment = shared_segment(nbytes)
    file = _file(segment)
    if file is not None:  # else shipped as torch ships any tensor
        _REUSED[segment.data_ptr()] = _Reused((token, os.getpid(), cycle, index), file)
    return segment


def forget_reused(segment: torch.UntypedStorage) -> None:
    """``segment`` is no longer refilled here (a bigger one replaces it)."""
    _REUSED.pop(segment.data_ptr(), None)


def reduce_reused(storage: torch.UntypedStorage, sent: list[_Reused]) -> tuple[Any, ...] | None:
    """How a pickler ships ``storage`` where it is one of this process's reused segments: its
    descriptor the first time (recorded in ``sent``, for :func:`unship`), its key afterwards;
    None for any other storage."""
    reused = _REUSED.get(storage.data_ptr()) if storage.device.type == "cpu" else None
    if reused is None or reused.key[1] != os.getpid():  # a forked child's copy of its parent's table
        return None
    if _file(storage) != reused.file:  # other memory where a segment dropped unforgotten was, or at its start
        return None
    shipped = None
    if not reused.shipped:
        reused.shipped = True
        sent.append(reused)
        shipped = descriptor(storage)
    return _receive, (reused.key, storage.nbytes(), shipped)


def unship(sent: list[_Reused]) -> None:
    """The pickling that shipped ``sent`` failed: their descriptors go with their next batch."""
    for reused in sent:
        reused.shipped = False


@dataclass
class Received:
    """The receiving process's mappings of the reused segments shipped to one loader."""

    segments: dict[Key, torch.UntypedStorage] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        """Drop every mapping (the workers stopped; new ones ship their buffers anew)."""
        with self.lock:
            self.segments = {}

    def take(self, key: Key, nbytes: int, shipped: tuple[Any, int] | None) -> torch.UntypedStorage:
        with self.lock:
            if shipped is not None:
                self._forget_ended()
                self.segments[key] = attach(shipped)
            segment = self.segments.get(key)
        if segment is None or segment.nbytes() < nbytes:
            raise LoaderError(f"worker process {key[1]} sent a batch in its shared buffer {key[3]} before the "
                              "buffer itself: a batch that carried it was lost on the way")
        return segment

    def _forget_ended(self) -> None:
        """Drop the mappings of worker processes that have ended (their memory goes with them)."""
        for pid in {key[1] for key in self.segments}:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                for key in [k for k in self.segments if k[1] == pid]:
                    del self.segments[key]
            except OSError:  # alive, but not ours to signal
                pass


_RECEIVERS: weakref.WeakValueDictionary[str, Received] = weakref.WeakValueDictionary()
_RECEIVERS_LOCK = threading.Lock()


def received(token: str) -> Received:
    """This process's :class:`Received` for the loader ``token`` names; it lives as long as a
    holder keeps it (each copy of the loader's builder here holds it)."""
    with _RECEIVERS_LOCK:
        found = _RECEIVERS.get(token)
        if found is None:
            found = _RECEIVERS[token] = Received()
        return found


def is_receiving(token: str) -> bool:
    """Whether this process holds a :class:`Received` for the loader ``token`` names (a copy of
    that loader lives here)."""
    with _RECEIVERS_LOCK:
        return token in _RECEIVERS


def _forget_in_child() -> None:
    """A forked child drops the mappings its parent received (a worker would hold them for its
    whole life); its own loaders' workers ship their buffers to it anew. The locks are new too:
    another thread of the parent may have held one at the fork."""
    global _RECEIVERS_LOCK
    _RECEIVERS_LOCK = threading.Lock()
    for receiver in list(_RECEIVERS.values()):
        receiver.segments, receiver.lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _receive(key: Key, nbytes: int, shipped: tuple[Any, int] | None) -> torch.UntypedStorage:
    receiver = _RECEIVERS.get(key[0])
    if receiver is None:  # no copy of the loader here: a descriptor still maps, a key cannot
        if shipped is None:
            raise LoaderError(f"worker process {key[1]} sent a batch for a loader this process does not hold")
        return attach(shipped)
    return receiver.take(key, nbytes, shipped)
