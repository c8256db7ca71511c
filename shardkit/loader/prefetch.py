"""Device prefetch: threads turn the next batches into device tensors while the step runs.

Three stages, each a thread, joined by bounded queues, so host and device work overlap:

1. *fetch*: take the next worker batch and stage it in the next pinned slot of the ring
   (:class:`~shardkit.loader.pinned.PinnedSlot`: JPEG bytes, geometry, labels, CPU pixels);
2. *decode*: batched nvJPEG (torchvision's call returns only when the batch is decoded, so it
   gets a thread of its own and decodes back to back, two staged batches per call when both
   are waiting);
3. *augment*: on a dedicated CUDA stream (after the decode's event), enqueue the small copies,
   the one crop-resize-flip launch and finalize, then record one event per batch. Decoded
   images live on the decode stream and are held until that event completes, because nvJPEG
   writes new outputs from its own stream without waiting for pending readers of reused memory.

The consumer makes its current stream wait for that event (no host synchronisation) and calls
``record_stream`` so the caching allocator does not give the batch's memory to the prefetch
stream while the consumer's stream may still use it. An exception in any stage reaches the
consumer unchanged (type and traceback). Augment device time comes from CUDA events read once
they have completed (``query``), never by waiting.

Why slot reuse is safe: each queue holds at most ``depth`` batches and the decode stage holds at
most ``merge <= depth``, so at most ``3 * depth + 3`` batches are between staging and the end of
the augment stage; the ring has ``3 * depth + 4``
slots, so when the fetch stage returns to a slot its previous batch has been fully enqueued, and
the slot's event (recorded after every copy out of it) is what :meth:`PinnedSlot.stage` waits for.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from shardkit.loader.batch import Batch
from shardkit.loader.gpu_pipeline import GpuPipeline
from shardkit.loader.pinned import PinnedSlot
from shardkit.loader.stats import StageStats

__all__ = ["DevicePrefetcher", "ring_size"]

_DONE = object()


def ring_size(depth: int) -> int:
    """Pinned slots needed for queues of ``depth`` (see module doc)."""
    return 3 * depth + 4


class DevicePrefetcher:
    """Iterate ``source``'s batches as finalised device batches, prepared ahead in threads.

    ``merge``: up to this many staged batches are decoded in one nvJPEG call when they are
    already waiting (fewer fixed costs per image). ``keep_alive``: how many recent worker batches to hold, so shared-memory buffers that workers
    reuse stay mapped in this process (no page faults on reuse). Stop early by closing the
    iterator (``for`` loops do it when abandoned).
    """

    def __init__(self, source: Iterator[Batch], pipeline: GpuPipeline, device: torch.device,
                 slots: list[PinnedSlot], stats: StageStats, depth: int, keep_alive: int = 0,
                 merge: int = 2) -> None:
        if depth < merge or len(slots) < ring_size(depth):
            raise ValueError(f"need depth >= 1 and {ring_size(depth)} slots, got {depth} and {len(slots)}")
        self.source, self.pipeline, self.device, self.slots = source, pipeline, device, slots
        self.merge = merge
        self.stats = stats  # stage times are added here
        self.stream = torch.cuda.Stream(device)  # augment: copies, kernel, finalize
        # nvJPEG writes its outputs on a stream of its own, ordered only after the caller's
        # current stream's *past* work; so decode outputs are allocated on this separate stream,
        # whose blocks are reused only after the augment that read them completed (see _augment)
        self.decode_stream = torch.cuda.Stream(device)
        self._q = [queue.Queue[Any](maxsize=depth) for _ in range(3)]  # staged, decoded, ready
        self._stop = threading.Event()
        self._keep: deque[Batch] = deque(maxlen=max(keep_alive, 1))
        self._timers: deque[tuple[torch.cuda.Event, torch.cuda.Event, list[torch.Tensor]]] = deque()
        stages = ((self._fetch, 0, self.stream), (self._decode, 1, self.decode_stream), (self._augment, 2, self.stream))
        self._threads = [threading.Thread(target=self._guard, args=args, name=f"shardkit-{args[0].__name__}", daemon=True)
                         for args in stages]
        for t in self._threads:
            t.start()

    def _put(self, q: queue.Queue[Any], item: object) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                q.put(item, timeout=0.1)
                return True
        return False

    def _items(self, q: queue.Queue[Any], out: queue.Queue[Any]) -> Iterator[Any]:
        """Items of ``q`` until the end marker or an error, which are passed on to ``out``."""
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):
                item = q.get(timeout=0.1)
                if item is _DONE or isinstance(item, BaseException):
                    self._put(out, item)
                    return
                yield item

    def _guard(self, stage: Any, out: int, stream: torch.cuda.Stream) -> None:
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
            t1 = time.perf_counter()
            slot.stage(batch)
            self.stats.gpu_copy_s += time.perf_counter() - t1
            if self._stop.is_set() or not self._put(self._q[0], (batch, slot)):
                return
            i, t0 = i + 1, time.perf_counter()
        self._put(self._q[0], _DONE)

    def _get(self, q: queue.Queue[Any]) -> Any:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):
                return q.get(timeout=0.1)
        return _DONE

    def _decode(self) -> None:
        pending: list[tuple[Batch, PinnedSlot]] = []
        while True:
            item = self._get(self._q[0])
            end = item is _DONE or isinstance(item, BaseException)
            if not end:
                pending.append(item)
            # decode now unless another staged batch is already waiting to join this call
            if pending and (end or len(pending) >= self.merge or self._q[0].qsize() == 0):
                t0 = time.perf_counter()
                decoded = self.pipeline.decode_many(pending)
                self.stats.gpu_decode_s += time.perf_counter() - t0
                done = torch.cuda.Event()
                done.record(self.decode_stream)
                for (b, s), d in zip(pending, decoded, strict=True):
                    if not self._put(self._q[1], (b, s, d, done)):
                        return
                pending = []
            if end:
                self._put(self._q[1], item)
                return

    def _augment(self) -> None:
        for batch, slot, (decoded, rejected), done in self._items(self._q[1], self._q[2]):
            t0 = time.perf_counter()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.stream.wait_event(done)
            e0.record(self.stream)
            ready = self.pipeline.augment(batch, slot, decoded, rejected)
            e1.record(self.stream)
            slot.release(self.stream)
            self._timers.append((e0, e1, decoded))  # decoded images stay allocated until e1
            while self._timers and self._timers[0][1].query():
                a, b, _ = self._timers.popleft()
                self.stats.gpu_augment_s += a.elapsed_time(b) / 1e3
            self.stats.gpu_host_s += time.perf_counter() - t0
            if not self._put(self._q[2], (ready, slot.event)):
                return

    def __iter__(self) -> Iterator[Batch]:
        current = torch.cuda.current_stream(self.device)
        try:
            while True:
                item = self._q[2].get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, event = item
                current.wait_event(event)
                for t in (batch.images, batch.labels):
                    if isinstance(t, torch.Tensor):
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
