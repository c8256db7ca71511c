"""Device prefetch: threads turn the next batches into device tensors while the step runs.

Three stages, each a thread, joined by bounded queues, so host and device work overlap:

1. *fetch*: take the next worker batch and stage it in the next of its *staging slots*
   (:class:`~shardkit.loader.routes.device.pinned.PinnedSlot`: JPEG bytes, geometry, labels, CPU pixels);
2. *decode*: batched nvJPEG (torchvision's call returns only when the batch is decoded, so it
   gets a thread of its own and decodes back to back, two staged batches per call when both
   are waiting); ``decode_threads`` > 1 runs that many batched-decoder threads taking staged
   batches from the same queue, each on its own CUDA stream (a gain only with a decoder that
   does not serialise its calls);
3. *augment*: takes decoded batches back in staging order (a small reorder buffer keyed by
   sequence number, since decode threads finish out of order); on a dedicated CUDA stream (after
   the decode's event), enqueue the small copies,
   the one crop-resize-flip launch and finalize, then record one event per batch. Decoded
   images live on the decode stream and are held until that event completes, because nvJPEG
   writes new outputs from its own stream without waiting for pending readers of reused memory.

The consumer makes its current stream wait for that event (no host synchronisation) and calls
``record_stream`` so the caching allocator does not give the batch's memory to the prefetch
stream while the consumer's stream may still use it. An exception in any stage reaches the
consumer unchanged (type and traceback). Augment GPU time comes from CUDA events read once
they have completed (``query``), never by waiting.

Why reusing a staging slot is safe: the fetch stage takes one of ``len(slots)`` permits before it stages
batch ``i`` into slot ``i % len(slots)``, and the augment stage gives one back after it has
enqueued every copy out of a slot and recorded the slot's event; augment runs in staging order,
so when batch ``i`` gets its permit batch ``i - len(slots)`` (the slot's previous batch) is
through, and the slot's event is what :meth:`PinnedSlot.stage` waits for.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

from shardkit.loader.routes.device.payload import StagedBatch
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.routes.device.stages import Decoded, DeviceStages, ReadyBatch
from shardkit.loader.stats import StageStats
from shardkit.loader.threads import name_this_thread

__all__ = ["DevicePrefetcher", "InOrder", "staging_slots"]

_DONE = object()


#: How long interpreter exit waits for a prefetcher's threads to finish their current batch.
EXIT_WAIT_S = 5.0


def _stop_threads(stop: threading.Event, threads: list[threading.Thread]) -> None:
    """Ask ``threads`` to stop and wait for them, at most :data:`EXIT_WAIT_S` in all (they finish
    the batch in hand and check ``stop`` at least every 0.1 s)."""
    stop.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    try:
        for t in threads:
            if t is not threading.current_thread():  # the last reference may drop in one of them
                t.join(timeout=max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:  # Ctrl-C at exit: stop waiting, and let the other exit handlers run
        pass


def staging_slots(depth: int) -> int:
    """Staging slots for queues of ``depth``: enough that no stage waits for a free slot."""
    return 3 * depth + 4


class InOrder:
    """Reorder buffer: :meth:`push` ``(seq, item)`` in any order, get items back in ``seq`` order.

    Example:
        >>> r = InOrder()
        >>> r.push(1, "b"), r.push(0, "a"), r.push(2, "c")
        ([], ['a', 'b'], ['c'])
    """

    def __init__(self) -> None:
        self.next, self._held = 0, dict[int, Any]()

    def push(self, seq: int, item: Any) -> list[Any]:
        """Hold ``item``; return the items now due (consecutive from the next expected seq)."""
        if seq < self.next or seq in self._held:
            raise ValueError(f"sequence number {seq} seen twice")
        self._held[seq] = item
        out = []
        while self.next in self._held:
            out.append(self._held.pop(self.next))
            self.next += 1
        return out

    def __len__(self) -> int:
        return len(self._held)


B = TypeVar("B", bound=StagedBatch)
D = TypeVar("D", bound=ReadyBatch)


class DevicePrefetcher(Generic[B, D]):
    """Iterate ``source``'s batches as finalised device batches, prepared ahead in threads.

    ``merge``: up to this many staged batches are decoded in one nvJPEG call when they are
    already waiting (fewer fixed costs per image). ``decode_threads``: threads calling the batched
    decoder, each on its own stream. ``keep_alive``: how many recent worker batches to hold, so
    shared-memory buffers that workers reuse stay mapped in this process (no page faults on
    reuse). Stop early by closing the iterator (``for`` loops do it when abandoned).
    """

    def __init__(self, source: Iterator[B], pipeline: DeviceStages[B, D], device: torch.device,
                 slots: list[PinnedSlot], stats: StageStats, depth: int, keep_alive: int = 0,
                 merge: int = 2, decode_threads: int = 1) -> None:
        if depth < merge or len(slots) < staging_slots(depth):
            raise ValueError(f"need depth >= {merge} and {staging_slots(depth)} slots, got {depth} and {len(slots)}")
        self.source, self.pipeline, self.device, self.slots = source, pipeline, device, slots
        self.merge = merge
        self.stats = stats  # stage times are added here
        self.stream = torch.cuda.Stream(device)  # augment: copies, kernel, finalize
        # nvJPEG writes its outputs on a stream of its own, ordered only after the caller's
        # current stream's *past* work; so decode outputs are allocated on separate streams (one
        # per decode thread), whose blocks are reused only after the augment that read them
        # completed (see _augment)
        self.decode_streams = [torch.cuda.Stream(device) for _ in range(decode_threads)]
        self._q = [queue.Queue[Any](maxsize=depth) for _ in range(3)]  # staged, decoded, ready
        self._stop = threading.Event()
        self._free = threading.Semaphore(len(slots))  # permits to (re)stage a slot, see module doc
        self._keep: deque[B] = deque(maxlen=max(keep_alive, 1))
        self._timers: deque[tuple[torch.cuda.Event, torch.cuda.Event, list[torch.Tensor]]] = deque()
        stages: list[tuple[Any, int, torch.cuda.Stream]] = [(self._fetch, 0, self.stream),
                                                             (self._augment, 2, self.stream)]
        stages += [(self._decode, 1, stream) for stream in self.decode_streams]
        self.decoders = len(self.decode_streams)
        self._threads = [threading.Thread(target=self._guard, args=args,
                                          name=f"shardkit-{args[0].__name__.lstrip('_')}", daemon=True)
                         for args in stages]
        for t in self._threads:
            t.start()
        # a script that ends without closing its loader: the threads stop at interpreter exit,
        # before native libraries are torn down under a decode or copy still running in one of
        # them (which can end the process in "terminate called without an active exception")
        weakref.finalize(self, _stop_threads, self._stop, self._threads)

    def _put(self, q: queue.Queue[Any], item: object) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                q.put(item, timeout=0.1)
                return True
        return False

    def _guard(self, stage: Any, out: int, stream: torch.cuda.Stream) -> None:
        name_this_thread(f"sk-{stage.__name__.lstrip('_')}")  # where the OS lists threads: "sk-decode"
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                stage()
        except BaseException as err:  # crosses to the consumer with its type and traceback
            self._put(self._q[out], err)

    def _fetch(self) -> None:
        i, t0 = 0, time.perf_counter()
        for batch in self.source:
            self.stats.gpu_fetch_wait_s += time.perf_counter() - t0
            self._keep.append(batch)
            slot = self.slots[i % len(self.slots)]
            while not self._free.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            t1 = time.perf_counter()
            slot.stage(batch)
            self.stats.gpu_copy_s += time.perf_counter() - t1
            if self._stop.is_set() or not self._put(self._q[0], (i, batch, slot)):
                return
            i, t0 = i + 1, time.perf_counter()
        for _ in range(self.decoders):
            self._put(self._q[0], _DONE)

    def _get(self, q: queue.Queue[Any]) -> Any:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):
                return q.get(timeout=0.1)
        return _DONE

    def _decode_loop(self, decode: Any, stream: torch.cuda.Stream, timer: str) -> None:
        """Decode staged batches with ``decode(items)`` until the end, adding seconds to ``stats.<timer>``."""
        pending: list[tuple[int, B, PinnedSlot]] = []
        while True:
            item = self._get(self._q[0])
            end = item is _DONE or isinstance(item, BaseException)
            if not end:
                pending.append(item)
            # decode now unless another staged batch is already waiting to join this call
            if pending and (end or len(pending) >= self.merge or self._q[0].qsize() == 0):
                t0 = time.perf_counter()
                decoded = decode([(b, s) for _, b, s in pending])
                setattr(self.stats, timer, getattr(self.stats, timer) + time.perf_counter() - t0)
                done = torch.cuda.Event()
                done.record(stream)
                for (seq, b, s), d in zip(pending, decoded, strict=True):
                    if not self._put(self._q[1], (seq, (b, s, d, done))):
                        return
                pending = []
            if end:
                self._put(self._q[1], item)
                return

    def _decode(self) -> None:
        """One decode thread; :meth:`_guard` made its own stream current."""
        self._decode_loop(self.pipeline.decode_many, torch.cuda.current_stream(self.device), "gpu_decode_s")

    def _augment(self) -> None:
        order, ended = InOrder(), 0
        while not self._stop.is_set():
            item = self._get(self._q[1])
            if isinstance(item, BaseException):
                self._put(self._q[2], item)
                return
            if item is _DONE:
                ended += 1
                if ended == self.decoders:
                    self._put(self._q[2], _DONE)
                    return
                continue
            for args in order.push(*item):
                if not self._augment_one(*args):
                    return

    def _augment_one(self, batch: B, slot: PinnedSlot, decoded_rejected: Decoded,
                     done: torch.cuda.Event) -> bool:
        decoded, rejected = decoded_rejected
        t0 = time.perf_counter()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.stream.wait_event(done)
        e0.record(self.stream)
        ready = self.pipeline.augment(batch, slot, decoded, rejected)
        e1.record(self.stream)
        slot.release(self.stream)
        self._free.release()
        self._timers.append((e0, e1, decoded))  # decoded images stay allocated until e1
        while self._timers and self._timers[0][1].query():
            a, b, _ = self._timers.popleft()
            self.stats.gpu_augment_s += a.elapsed_time(b) / 1e3
        self.stats.gpu_host_s += time.perf_counter() - t0
        return self._put(self._q[2], (ready, slot.event))

    def __iter__(self) -> Iterator[D]:
        try:
            while True:
                item = self._get(self._q[2])  # _DONE once closed: a closed prefetcher never blocks
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, event = item
                current = torch.cuda.current_stream(self.device)  # per batch: a prefetcher can outlive an epoch
                current.wait_event(event)
                for t in batch.tensors():
                    t.record_stream(current)
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        """Stop the threads (after their current batch) and drop what they prepared."""
        self._stop.set()
        for t in self._threads:
            while t.is_alive():
                for q in self._q:
                    with contextlib.suppress(queue.Empty):
                        q.get_nowait()
                t.join(timeout=0.05)
