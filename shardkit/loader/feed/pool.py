"""Feeder processes: a route's host half in processes of its own, handing batches over by shared memory.

Why: a compiled training step is often *host-bound* (its Python and kernel launches set its
pace), and every thread the loader runs in the training process competes with it for the GIL
and the host. Measured on an H200 (docs/performance.md, "Feeders against none"), a compiled ResNet-18
step kept 61% of its rate fed by the GPU route in its own process, 96% with the same route
running flat out in *another* process, and 83% fed by the route in three feeder processes: the
loss was the shared interpreter, not the GPU. Several feeders also decode in parallel (each
has its own nvJPEG), which a single process cannot (torchvision serialises its calls).

**Layout** of workers and batches over the feeders: :mod:`~shardkit.loader.feed.layout`.

**Hand-off.** Each feeder owns a ring of :data:`RING` slots (one batch of images and labels
each; a captioned batch's token ids in place of labels: :mod:`~shardkit.loader.feed.labels`) on
the route's device: CUDA memory opened in the training process through CUDA IPC, or
shared memory on the CPU. A feeder copies a finished batch into a free slot on its stream and
records the slot's interprocess CUDA event; the loader makes its current stream wait for that
event, copies the slot into fresh tensors (so batches live as long as the user keeps them, as
without feeders), records its own interprocess event for the slot and hands it back. Nothing
synchronises the host in steady state; what the training process does per batch is one pipe
message, two event calls and two copies enqueued.

**Messages**: one duplex pipe per feeder, numbered by epoch; the feeder's side and the protocol
are in :mod:`~shardkit.loader.feed.process`.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import pickle
import time
from collections.abc import Generator, Iterator
from typing import Any

import torch
import torch.multiprocessing  # registers the reductions that send CUDA and shared tensors through pipes

from shardkit._compat import hidden_main
from shardkit.errors import LoaderError, ShardkitError
from shardkit.loader.epochs.remainder import Remainder
from shardkit.loader.feed.handle import Handle, close_all
from shardkit.loader.feed.layout import feeder_of
from shardkit.loader.feed.logs import LogRelay
from shardkit.loader.feed.process import RING, FeederSpec
from shardkit.loader.feed.ready import forkserver, ready
from shardkit.loader.run.forks import keep_in_forked_children
from shardkit.loader.run.stream import reraise
from shardkit.loader.stats import StageStats

__all__ = ["RING", "FeederPool", "FeederSpec", "sendable"]

#: Seconds a feeder may take to start (import torch, open CUDA) before the loader gives up.
START_TIMEOUT_S = 300.0
#: Seconds :meth:`FeederPool.poll_started` leaves the launch to a forkserver not yet ready
#: (:mod:`~shardkit.loader.feed.ready`) before it launches anyway, and waits.
READY_WAIT_S = 60.0
#: Seconds a feeder may take to abandon an epoch (its current batch) before the pool is stopped.
STOP_TIMEOUT_S = 60.0


#: What a feeder imports before its first batch: the forkserver imports it once for every feeder.
PRELOAD = ("shardkit.loader.feed.process",)


def _context() -> Any:
    """How feeders start: forked from a server that imported torch and shardkit once (a spawned
    feeder would import them again, seconds of CPU per feeder and loader), else spawned. Either
    way a feeder starts from a fresh interpreter's state: no CUDA context, threads or locks of
    the training process."""
    return forkserver(PRELOAD) or torch.multiprocessing.get_context("spawn")


def sendable(spec: FeederSpec) -> bytes:
    """``spec`` pickled for a feeder process.

    Raises:
        LoaderError: something in it (a transform, storage options) cannot reach a feeder,
            typically a class or function defined in the training script itself.
    """
    try:
        with hidden_main():  # a feeder must not run the training script
            return pickle.dumps(spec)
    except Exception as err:
        raise LoaderError(f"feeders cannot run this loader: its arguments cannot be sent to another process ({err}); "
                          "define custom transforms in a module rather than in the training script, or use "
                          "feeders=0") from None


class FeederPool:
    """``len(specs)`` feeder processes running an ImageFolder or captioned dataset's route for one
    loader (module doc).

    Started on the first :meth:`epoch`, kept across epochs, stopped by :meth:`close` (and when
    the pool is garbage collected, or at interpreter exit before multiprocessing joins its
    children). One epoch runs at a time: starting another, or closing the pool, ends the
    iterator of the one before (it then ends early, as an in-process route's does).

    Raises:
        LoaderError: a spec cannot be sent to a feeder process (:func:`sendable`).
    """

    def __init__(self, specs: list[FeederSpec]) -> None:
        self.payloads = [sendable(spec) for spec in specs]
        _context()  # the forkserver imports torch and shardkit while the script builds its model
        self.parts = len(specs)
        self.workers = sum(s.route.num_workers for s in specs)
        self.device = specs[0].route.device
        self._handles: list[Handle] = []
        self._finalizer: multiprocessing.util.Finalize | None = None
        #: launched, not yet all started: the handles, their log relay, the start messages taken
        self._launched: tuple[list[Handle], LogRelay, dict[int, tuple[Any, ...]]] | None = None
        self._launched_at = 0.0
        self._made_at = time.monotonic()
        self._gen = 0
        self._active: Generator[tuple[torch.Tensor, torch.Tensor, list[str]], None, None] | None = None
        keep_in_forked_children(self)  # the rings it opens: a forked child must not free them

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a pickled or deep-copied loader) starts feeders of its own on its first epoch;
        # the running ones, their rings and the epoch they deliver stay the original's
        return {**self.__dict__, "_handles": [], "_finalizer": None, "_launched": None, "_active": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        keep_in_forked_children(self)  # a copy's rings, as the original's

    @property
    def running(self) -> bool:
        """Whether the feeder processes are started."""
        return bool(self._handles)

    @property
    def pids(self) -> list[int]:
        """The feeder processes' pids (empty until the first epoch starts them)."""
        return [h.process.pid for h in self._handles]

    @property
    def launched(self) -> bool:
        """Whether the feeder processes are launched and not yet all started (see :meth:`launch`)."""
        return self._launched is not None

    def launch(self) -> None:
        """Launch the feeder processes without waiting for them to start: :meth:`poll_started`
        (which never waits) or :meth:`start` (which does) finishes their start. Runs in the
        training thread: a launch hides ``__main__`` from the feeders for as long as it takes (the
        forkserver may still be importing torch), which another thread would see.

        Raises:
            LoaderError: a feeder could not be launched (naming why).
        """
        if self._handles or self._launched is not None:
            return
        if self.device.type == "cuda" and self.device.index is None:  # CUDA IPC needs the index: the current one
            self.device = torch.device("cuda", torch.cuda.current_device())
        index = self.device.index if self.device.type == "cuda" else None
        ctx = _context()
        handles: list[Handle] = []
        logs = LogRelay(ctx)
        with self._start_errors(handles, logs):
            for part, payload in enumerate(self.payloads):
                handles.append(Handle(part, payload, index, ctx, logs))
        self._launched, self._launched_at = (handles, logs, {}), time.monotonic()
        # runs at interpreter exit before multiprocessing joins its (non-daemonic) children
        self._finalizer = multiprocessing.util.Finalize(self, close_all, args=(handles, logs), exitpriority=10)

    def poll_started(self) -> bool:
        """True once the feeder processes run: takes the start messages the launched feeders have
        sent, without waiting for the others. Launches them first once the forkserver is ready to
        fork them at once (:func:`~shardkit.loader.feed.ready.ready`; after :data:`READY_WAIT_S`
        whether it is or not: the launch then waits).

        Raises:
            LoaderError: a feeder could not start or died starting (naming it and why).
        """
        if self._handles:
            return True
        if self._launched is None:
            if not ready() and time.monotonic() - self._made_at < READY_WAIT_S:
                return False
            self.launch()
        assert self._launched is not None
        handles, logs, got = self._launched
        with self._start_errors(handles, logs):
            for h in handles:
                if h.part not in got and (h.conn.poll(0) or not h.process.is_alive()):
                    got[h.part] = h.recv(timeout=START_TIMEOUT_S, doing="start")
            late = [h for h in handles if h.part not in got]
            if late and time.monotonic() - self._launched_at > START_TIMEOUT_S:
                raise LoaderError(f"feeder process {late[0].part} (pid {late[0].process.pid}) did not start within "
                                  f"{START_TIMEOUT_S:.0f} s")
        if len(got) < len(handles):
            return False
        self._started(handles, logs, got)
        return True

    def start(self) -> None:
        """Start the feeder processes and take their rings, waiting for them (the first epoch
        does it otherwise).

        Raises:
            LoaderError: a feeder could not start or died starting (naming it and why).
        """
        if self._handles:
            return
        self.launch()
        assert self._launched is not None
        handles, logs, got = self._launched
        with self._start_errors(handles, logs):
            for h in handles:
                if h.part not in got:
                    got[h.part] = h.recv(timeout=START_TIMEOUT_S, doing="start")
        self._started(handles, logs, got)

    def _started(self, handles: list[Handle], logs: LogRelay, got: dict[int, tuple[Any, ...]]) -> None:
        """Every feeder said it started (``got``: part -> message): open their rings and events."""
        with self._start_errors(handles, logs):
            for h in handles:
                msg = got[h.part]
                if msg[0] == "error":
                    reraise(msg[2])
                h.images, h.labels, events = msg[2], msg[3], msg[4]
                if events:
                    h.ready = [torch.cuda.Event.from_ipc_handle(self.device, x) for x in events]
                    with torch.cuda.device(self.device):  # an event belongs to the device current at its handle
                        h.released = [torch.cuda.Event(interprocess=True) for _ in events]
                        released = [e.ipc_handle() for e in h.released]
                    h.send("released", released)
        self._handles, self._launched = handles, None

    @contextlib.contextmanager
    def _start_errors(self, handles: list[Handle], logs: LogRelay) -> Iterator[None]:
        """A start that fails stops the feeders launched so far; errors other than shardkit's
        become a LoaderError saying so."""
        try:
            yield
        except BaseException as err:
            close_all(handles, logs)
            self._launched = None
            if self._finalizer is not None:
                self._finalizer.cancel()
                self._finalizer = None
            if isinstance(err, ShardkitError) or not isinstance(err, Exception):
                raise
            raise LoaderError(f"feeder processes could not start ({type(err).__name__}: {err}); "
                              "use feeders=0") from err

    def _take(self, h: Handle, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot ``k`` of ``h``'s ring as fresh tensors; the slot goes back to the feeder."""
        if h.ready:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(h.ready[k])
            images, labels = h.images[k][:n].clone(), h.labels[k][:n].clone()
            h.released[k].record(stream)
        else:
            images, labels = h.images[k][:n].clone(), h.labels[k][:n].clone()
        h.send("free", k)
        return images, labels

    @staticmethod
    def _next(h: Handle, gen: int, timeout: float | None = None, doing: str = "answer") -> tuple[Any, ...]:
        """``h``'s next message of epoch ``gen`` (those left over from earlier epochs are dropped)."""
        while True:
            msg = h.recv(timeout, doing)
            if msg[0] in ("batch", "end", "error", "stopped") and msg[1] != gen and msg[1] is not None:
                continue  # left over from an earlier epoch (an error of the feeder itself has no epoch)
            return msg

    def epoch(self, epoch: int, start: int, count: int, rest: Remainder | None,
              stats: StageStats) -> Generator[tuple[torch.Tensor, torch.Tensor, list[str]], None, None]:
        """Batches ``start .. count - 1`` of ``epoch`` as ``(images, labels, keys)``, in order
        (``rest``: what an elastic resume left of the epoch, or None).

        Stats: the feeders' counters, and this process's wait (``wait_s``), hand-over (``copy_s``)
        and delivery (``elapsed_s``) times. Closing the iterator early stops the feeders' epoch;
        so does the next call (an iterator of the epoch before ends).
        """
        self._end_active()
        self._gen += 1
        self._active = self._run(self._gen, epoch, start, count, rest, stats)
        return self._active

    def _end_active(self) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.close()

    def _run(self, gen: int, epoch: int, start: int, count: int, rest: Remainder | None,
             stats: StageStats) -> Generator[tuple[torch.Tensor, torch.Tensor, list[str]], None, None]:
        if not self._handles:
            self.start()
        handles = self._handles
        ended: set[int] = set()
        try:
            for h in handles:  # a feeder found dead here stops the pool (finally): the next epoch starts anew
                h.send("epoch", gen, epoch, start, rest)
            last = time.perf_counter()
            for i in range(count - start):
                h = handles[feeder_of(i, num_workers=self.workers, parts=self.parts)]
                t0 = time.perf_counter()
                msg = self._next(h, gen)
                if msg[0] != "batch":
                    ended.add(h.part)
                    if msg[0] == "error":
                        reraise(msg[2])
                    raise LoaderError(f"feeder process {h.part} ended epoch {epoch} early ({i} of {count - start} "
                                      "batches delivered)")
                _, _, k, n, keys, feeder_stats = msg
                t1 = time.perf_counter()
                images, labels = self._take(h, k, n)
                t2 = time.perf_counter()
                feeder_stats.wait_s = feeder_stats.copy_s = feeder_stats.elapsed_s = 0.0
                stats.add(feeder_stats)
                stats.wait_s += t1 - t0
                stats.copy_s += t2 - t1
                stats.elapsed_s += t2 - last
                last = t2
                yield images, labels, keys
            for h in handles:  # each feeder ends its part
                msg = self._next(h, gen)
                if msg[0] == "error":
                    ended.add(h.part)
                    reraise(msg[2])
                if msg[0] != "end":
                    raise LoaderError(f"feeder process {h.part} delivered more batches than epoch {epoch} has")
                ended.add(h.part)
        finally:
            if self._gen == gen:
                self._active = None
                if handles is self._handles and self._stop(handles, gen, skip=ended):
                    self.close()

    def _stop(self, handles: list[Handle], gen: int, skip: set[int]) -> bool:
        """Make every feeder not in ``skip`` abandon epoch ``gen`` (what it sent meanwhile is
        dropped); True when one is dead or did not answer within :data:`STOP_TIMEOUT_S`."""
        broken = False
        for h in handles:
            if h.part in skip:
                continue
            if h.bad:
                broken = True
                continue
            try:
                h.send("stop", gen)
                while self._next(h, gen, STOP_TIMEOUT_S, "stop")[0] != "stopped":
                    pass  # a batch, or the "end"/"error" sent before the stop arrived
            except LoaderError:
                broken = True
        return broken

    def close(self) -> None:
        """End the running epoch's iterator and stop the feeder processes (idempotent; a later
        epoch starts new ones)."""
        self._end_active()
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._handles, self._launched = [], None
