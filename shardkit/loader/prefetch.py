"""Device prefetch: a thread turns batch i+1 into device tensors while the step runs on batch i.

The thread pulls worker batches, stages them through a ring of pinned slots
(:class:`~shardkit.loader.pinned.PinnedSlot`) and runs the GPU pipeline on a dedicated CUDA
stream, recording one event per batch. The consumer makes its current stream wait for that event
(no host synchronisation) and calls ``record_stream`` so the caching allocator does not hand the
batch's memory to the prefetch stream while the consumer's stream may still use it. Exceptions in
the thread reach the consumer unchanged (type and traceback). Device times of decode and augment
come from CUDA events read only once they have completed (``query``), never by waiting.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator

import torch

from shardkit.loader.batch import Batch
from shardkit.loader.pinned import PinnedSlot
from shardkit.loader.stats import StageStats

__all__ = ["DevicePrefetcher"]

_DONE = object()
Process = Callable[[Batch, PinnedSlot, Callable[[], None]], Batch]


class DevicePrefetcher:
    """Iterate ``process(batch, slot)`` of each batch of ``source``, ``depth`` batches ahead.

    ``process(batch, slot, mark)`` runs in a background thread on the prefetch stream, must only
    enqueue work, and calls ``mark()`` between decoding and augmenting (for the stage times).
    Stop early by closing the iterator (``for`` loops do it when abandoned).
    """

    def __init__(self, source: Iterator[Batch], process: Process, device: torch.device,
                 slots: list[PinnedSlot], stats: StageStats) -> None:
        if len(slots) < 2:
            raise ValueError(f"need at least 2 pinned slots, got {len(slots)}")
        self.source, self.process, self.device, self.slots = source, process, device, slots
        self.stats = stats  # device times are added here once their events complete
        self.stream = torch.cuda.Stream(device)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=len(slots) - 1)
        self._stop = threading.Event()
        self._timers: deque[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]] = deque()
        self._thread = threading.Thread(target=self._run, name="shardkit-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _harvest(self) -> None:
        while self._timers and self._timers[0][2].query():
            e0, e1, e2 = self._timers.popleft()
            self.stats.gpu_decode_s += e0.elapsed_time(e1) / 1e3
            self.stats.gpu_augment_s += e1.elapsed_time(e2) / 1e3

    def _run(self) -> None:
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
                for i, batch in enumerate(self.source):
                    if self._stop.is_set():
                        return
                    slot = self.slots[i % len(self.slots)]
                    e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                    e0.record(self.stream)
                    ready = self.process(batch, slot, lambda e=e1: e.record(self.stream))
                    e2.record(self.stream)
                    slot.release(self.stream)
                    self._timers.append((e0, e1, e2))
                    self._harvest()
                    if not self._put((ready, slot.event)):
                        return
            self._put(_DONE)
        except BaseException as err:  # crosses to the consumer with its type and traceback
            self._put(err)

    def __iter__(self) -> Iterator[Batch]:
        current = torch.cuda.current_stream(self.device)
        try:
            while True:
                item = self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, event = item  # type: ignore[misc]
                current.wait_event(event)
                for t in (batch.images, batch.labels):
                    if isinstance(t, torch.Tensor):
                        t.record_stream(current)
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread (after its current batch) and drop what it prepared."""
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        self._thread.join()
