"""Feeder processes: a route's host half in processes of its own, handing batches over by shared memory.

Why: a compiled training step is often *host-bound* (its Python and kernel launches set its
pace), and every thread the loader runs in the training process competes with it for the GIL
and the host. Measured on an H200 (BENCHMARKS.md, "Feeder processes"), a compiled ResNet-18
step kept 61% of its rate fed by the GPU route in its own process, 96% with the same route
running flat out in *another* process, and 83% fed by the route in three feeder processes: the
loss was the shared interpreter, not the GPU. Several feeders also decode in parallel (each
has its own nvJPEG), which a single process cannot (torchvision serialises its calls).

**Layout.** ``P`` feeders share the loader's ``W`` workers: worker ``g`` runs in feeder
``g % P`` as its worker ``g // P`` (:attr:`~shardkit.loader.stream.BatchStream.layout`). Worker
``g`` builds batches ``start + i`` with ``i % W == g``
(:func:`~shardkit.loader.plan.worker_batch_indices`), each feeder's DataLoader merges its
workers round-robin, so feeder ``p`` yields its batches in increasing order, and the loader
takes batch ``start + i`` from feeder ``(i % W) % P``: exactly the batches, order, samples and
augmentation of the same loader without feeders, for any ``P``.

**Hand-off.** Each feeder owns a ring of :data:`RING` slots (one batch of images and labels
each) on the route's device: CUDA memory opened in the training process through CUDA IPC, or
shared memory on the CPU. A feeder copies a finished batch into a free slot on its stream and
records the slot's interprocess CUDA event; the loader makes its current stream wait for that
event, copies the slot into fresh tensors (so batches live as long as the user keeps them, as
without feeders), records its own interprocess event for the slot and hands it back. Nothing
synchronises the host in steady state; what the training process does per batch is one pipe
message, two event calls and two copies enqueued.

**Messages** (one duplex pipe per feeder). To the feeder: ``("epoch", epoch, start,
remainder)``, ``("free", slot)``, ``("released", handles)``, ``("stop",)`` (abandon the epoch,
answered by ``("stopped",)``) and ``("close",)``. From it: ``("started", pid, images,
labels, handles)`` (its ring) once, ``("batch", slot, n, keys, stats)``, ``("end",)``,
``("error", failure)`` and ``("stopped",)``. A feeder exits when its pipe closes (the training
process ended), so none outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
import types
import weakref
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing  # registers the reductions that send CUDA and shared tensors through pipes

from shardkit.errors import LoaderError, ShardkitError
from shardkit.index.manifest import Manifest
from shardkit.loader.gpu.options import GpuOptions
from shardkit.loader.reader import ShardReader
from shardkit.loader.remainder import Remainder
from shardkit.loader.stats import StageStats
from shardkit.loader.stream import BatchStream, PlanConfig, WorkerFailure, raise_failures, reraise
from shardkit.transforms.base import ImageTransform

__all__ = ["RING", "FeederPool", "FeederSpec", "auto_feeders", "feeder_of", "feeder_workers"]

#: Ring slots per feeder: batches it may have finished ahead of the training loop.
RING = 4
#: Workers per feeder that ``feeders="auto"`` aims at (measured: 3 feeders of 5 workers fed
#: ResNet-18 best of 1 to 3 on a 16-core H200 host).
WORKERS_PER_FEEDER = 5
MAX_FEEDERS = 4
#: Seconds a feeder may take to start (import torch, open CUDA) before the loader gives up.
START_TIMEOUT_S = 300.0
#: Seconds a feeder may take to abandon an epoch (its current batch) before the pool is stopped.
STOP_TIMEOUT_S = 60.0


def auto_feeders(num_workers: int) -> int:
    """Feeders for ``feeders="auto"`` on the GPU route: one per :data:`WORKERS_PER_FEEDER`
    workers, at least 1 and at most :data:`MAX_FEEDERS`; 0 without workers.

    Example:
        >>> [auto_feeders(w) for w in (0, 1, 8, 16, 32)]
        [0, 1, 1, 3, 4]
    """
    if num_workers == 0:
        return 0
    return max(1, min(MAX_FEEDERS, num_workers // WORKERS_PER_FEEDER))


def feeder_workers(part: int, parts: int, num_workers: int) -> int:
    """How many of ``num_workers`` workers feeder ``part`` of ``parts`` runs (those ``g`` with ``g % parts == part``).

    >>> [feeder_workers(p, 3, 16) for p in range(3)]
    [6, 5, 5]
    """
    return len(range(part, num_workers, parts))


def feeder_of(i: int, *, num_workers: int, parts: int) -> int:
    """The feeder that builds the ``i``-th batch from the epoch's resume point (see the module doc).

    >>> [feeder_of(i, num_workers=4, parts=2) for i in range(6)]
    [0, 1, 0, 1, 0, 1]
    """
    return (i % num_workers) % parts


@dataclass(frozen=True)
class FeederSpec:
    """What a feeder process needs to run its part of the route (pickled to it once)."""

    manifest: Manifest
    reader: ShardReader
    transform: ImageTransform
    device: torch.device
    on_error: str
    batch_size: int
    prefetch: int
    gpu: GpuOptions
    config: PlanConfig
    part: int
    parts: int
    num_workers: int  # this feeder's workers
    total_workers: int  # all feeders' workers


# --------------------------------------------------------------------------- the feeder process


class _Stop(Exception):
    """The loader abandoned the epoch (or closed the feeder): end this epoch's iteration."""

    def __init__(self, close: bool) -> None:
        super().__init__("stop")
        self.close = close


def _failure(err: BaseException, pid: int) -> WorkerFailure:
    """An error of the feeder as a record the loader re-raises with its type (ShardkitErrors) or
    as a LoaderError naming the feeder (anything else)."""
    if isinstance(err, ShardkitError):
        return WorkerFailure(type(err), err.message, err.where, traceback.format_exc())
    return WorkerFailure(LoaderError, f"feeder process {pid} failed: {type(err).__name__}: {err}", "",
                         traceback.format_exc())


class _Feeder:
    """The feeder's side: its route, workers, ring and pipe (runs in :func:`feeder_main`)."""

    def __init__(self, spec: FeederSpec, conn: Any) -> None:
        from shardkit.loader.routing import choose_route
        from shardkit.loader.workers import worker_loader

        self.spec, self.conn = spec, conn
        local = spec.num_workers
        self.route = choose_route(spec.manifest, spec.reader, spec.transform, spec.device, on_error=spec.on_error,
                                  batch_size=spec.batch_size, num_workers=local, prefetch=spec.prefetch,
                                  gpu=spec.gpu, masks=False, pad=False, contiguous_labels=False)
        self.device = self.route.device
        self.cuda = self.device.type == "cuda"
        self.control = torch.zeros(2, dtype=torch.int64).share_memory_()
        self.stream = BatchStream(spec.config, self.route.builder, self.control,
                                  layout=(spec.part, spec.parts, spec.total_workers))
        self.dataloader = worker_loader(self.stream, num_workers=local, prefetch=spec.prefetch,
                                        pin_memory=self.route.pin_memory)
        self.stats = StageStats()
        self.ring: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ready: list[torch.cuda.Event] = []
        self.released: list[torch.cuda.Event] | None = None
        self.free: deque[int] = deque()
        self.used: set[int] = set()  # slots the loader has handed back at least once (their release events count)

    # -- messages
    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "free":
            self.free.append(msg[1])
            self.used.add(msg[1])
        elif kind == "released":
            self.released = [torch.cuda.Event.from_ipc_handle(self.device, h) for h in msg[1]]
        elif kind in ("stop", "close"):
            raise _Stop(close=kind == "close")
        else:
            raise RuntimeError(f"unexpected message {kind!r} during an epoch")

    def _poll(self) -> None:
        while self.conn.poll():
            self._handle(self.conn.recv())

    def _slot(self) -> int:
        self._poll()
        while not self.free:
            self._handle(self.conn.recv())
        return self.free.popleft()

    # -- the ring
    def _make_ring(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[bytes]]:
        """The ring, made before any thread of the route runs (sharing CUDA memory while the
        decode thread runs nvJPEG crashed torch's ``_share_cuda_``): slots shaped and laid out
        as the transform's finalised batches."""
        b, (h, w) = self.spec.batch_size, self.spec.transform.output_size
        probe = self.spec.transform.finalize(torch.zeros((1, 3, h, w), dtype=torch.uint8, device=self.device))
        last = probe.is_contiguous(memory_format=torch.channels_last) and not probe.is_contiguous()
        fmt = torch.channels_last if last else torch.contiguous_format
        for _ in range(RING):
            images = torch.empty((b, 3, h, w), dtype=probe.dtype, device=self.device, memory_format=fmt)
            labels = torch.empty(b, dtype=torch.int64, device=self.device)
            self.ring.append((images, labels) if self.cuda else (images.share_memory_(), labels.share_memory_()))
        handles: list[bytes] = []
        if self.cuda:
            self.ready = [torch.cuda.Event(interprocess=True) for _ in range(RING)]
            handles = [e.ipc_handle() for e in self.ready]
        self.free.extend(range(RING))
        return [r[0] for r in self.ring], [r[1] for r in self.ring], handles

    def _hand_over(self, images: torch.Tensor, labels: torch.Tensor, keys: list[str]) -> None:
        if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise LoaderError("feeders hand over batches of one image tensor and one label tensor; "
                              "this route delivers something else (use feeders=0)")
        k = self._slot()
        n = images.shape[0]
        slot_images, slot_labels = self.ring[k]
        if images.shape[1:] != slot_images.shape[1:] or images.dtype != slot_images.dtype or n > slot_images.shape[0]:
            raise LoaderError(f"a batch of {tuple(images.shape)} {images.dtype} does not fit the feeders' slots of "
                              f"{tuple(slot_images.shape)} {slot_images.dtype}; use feeders=0")
        if self.cuda:
            stream = torch.cuda.current_stream(self.device)
            if k in self.used:
                while self.released is None:
                    self._handle(self.conn.recv())
                stream.wait_event(self.released[k])
            slot_images[:n].copy_(images, non_blocking=True)
            slot_labels[:n].copy_(labels, non_blocking=True)
            self.ready[k].record(stream)
        else:
            slot_images[:n].copy_(images)
            slot_labels[:n].copy_(labels)
        self.conn.send(("batch", k, n, keys, self.stats.take()))

    # -- epochs
    def _restart_workers(self, remainder: tuple[int, Remainder] | None) -> None:
        from shardkit.loader.workers import shutdown_workers, workers_running

        if remainder is None or self.stream.remainder == remainder:
            return
        if workers_running(self.dataloader):
            shutdown_workers(self.dataloader)
            self.route.workers_stopped()
        self.stream.remainder = remainder

    def epoch(self, epoch: int, start: int, remainder: tuple[int, Remainder] | None) -> bool:
        """Run one epoch's part; False when the loader closed this feeder meanwhile."""
        from shardkit.loader.workers import workers_running

        self._restart_workers(remainder)
        self.control[0], self.control[1] = epoch, start
        if not workers_running(self.dataloader):
            self.route.before_workers()
        delivered = self.route.deliver(raise_failures(self.dataloader), self.stats)
        try:
            for images, labels, keys in delivered:
                self._hand_over(images, labels, keys)
            self.conn.send(("end",))
        except _Stop as stop:
            delivered.close()
            self.stats.take()  # the counters of a batch never handed over, as an undelivered batch's
            if stop.close:
                return False
            self.conn.send(("stopped",))
        except Exception as err:
            delivered.close()
            from shardkit.loader.workers import worker_death

            death = worker_death(self.dataloader)
            self.conn.send(("error", _failure(death if death is not None else err, os.getpid())))
        return True

    def serve(self) -> None:
        while True:
            msg = self.conn.recv()
            if msg[0] == "epoch":
                if not self.epoch(*msg[1:]):
                    return
            elif msg[0] == "close":
                return
            elif msg[0] == "stop":
                self.conn.send(("stopped",))
            else:
                self._handle(msg)

    def close(self) -> None:
        from shardkit.loader.workers import shutdown_workers

        self.route.close()
        shutdown_workers(self.dataloader)
        self.route.workers_stopped()
        self.spec.reader.close()


def feeder_main(spec: FeederSpec, conn: Any) -> None:
    """A feeder process's body (see the module doc). Ctrl-C is the training process's to handle:
    it stops its feeders; a feeder whose pipe closes exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    feeder: _Feeder | None = None
    try:
        if spec.device.type == "cuda":
            torch.cuda.set_device(spec.device)
        feeder = _Feeder(spec, conn)
        conn.send(("started", os.getpid(), *feeder._make_ring()))
        feeder.serve()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the training process is gone
    except BaseException as err:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", _failure(err, os.getpid())))
    finally:
        if feeder is not None:
            feeder.close()


# --------------------------------------------------------------------------- the training process


def _spawn_without_main(process: Any) -> None:
    """Start a spawned ``process`` without re-running the training script in it.

    A spawned child imports the parent's ``__main__`` from its path, running every top-level
    statement of a script without an ``if __name__ == "__main__":`` guard (a training loop,
    in a process that must only feed). The feeder needs nothing from that module, so it is
    hidden from multiprocessing's preparation data while the child starts.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        process.start()
    finally:
        sys.modules["__main__"] = main


class _Handle:
    """The loader's side of one feeder: its process, pipe, ring and events."""

    def __init__(self, spec: FeederSpec, ctx: Any) -> None:
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=feeder_main, args=(spec, theirs), name=f"shardkit-feeder-{spec.part}")
        _spawn_without_main(self.process)
        theirs.close()  # only the feeder holds its end: its exit closes the pipe
        self.part = spec.part
        self.images: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.ready: list[torch.cuda.Event] = []
        self.released: list[torch.cuda.Event] = []

    def died(self) -> LoaderError:
        self.process.join(timeout=2.0)
        code = self.process.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return LoaderError(f"feeder process {self.part} (pid {self.process.pid}) {how}; if SIGKILL, most likely the "
                           "out-of-memory killer: fewer workers or feeders, or feeders=0")

    def recv(self, timeout: float | None = None, doing: str = "answer") -> tuple[Any, ...]:
        """The next message; a dead feeder, or none within ``timeout`` seconds, raises a LoaderError
        naming it (``doing``: what it did not do in time)."""
        waited = 0.0
        while True:
            try:
                if self.conn.poll(1.0):
                    return self.conn.recv()
            except (EOFError, OSError):
                raise self.died() from None
            waited += 1.0
            if not self.process.is_alive():
                raise self.died()
            if timeout is not None and waited >= timeout:
                raise LoaderError(f"feeder process {self.part} (pid {self.process.pid}) did not {doing} within "
                                  f"{timeout:.0f} s")

    def send(self, *msg: Any) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError):
            raise self.died() from None


def _close_all(handles: list[_Handle]) -> None:
    """Ask every feeder to stop, then make sure it did (terminate after a grace period). The
    ring's tensors are dropped first, so a feeder exits with none of its memory still mapped here."""
    for h in handles:
        h.images, h.labels, h.ready, h.released = [], [], [], []
    for h in handles:
        with contextlib.suppress(OSError, ValueError):
            h.conn.send(("close",))
    deadline = time.monotonic() + 10.0
    for h in handles:
        h.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if h.process.is_alive():
            h.process.terminate()
            h.process.join(timeout=5.0)
        h.conn.close()


class FeederPool:
    """``parts`` feeder processes running a classification route for one loader (module doc).

    Started on the first :meth:`epoch`, kept across epochs, stopped by :meth:`close` (and when
    the pool is garbage collected or the interpreter exits).
    """

    def __init__(self, specs: list[FeederSpec]) -> None:
        self.specs = specs
        self.parts = len(specs)
        self.workers = sum(s.num_workers for s in specs)
        self.device = specs[0].device
        self._handles: list[_Handle] = []
        self._finalizer: weakref.finalize | None = None

    @property
    def running(self) -> bool:
        return bool(self._handles)

    @property
    def pids(self) -> list[int]:
        """The feeder processes' pids (empty until the first epoch starts them)."""
        return [h.process.pid for h in self._handles]

    def _start(self) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        handles: list[_Handle] = []
        try:
            for spec in self.specs:
                handles.append(_Handle(spec, ctx))
            for h in handles:
                msg = h.recv(timeout=START_TIMEOUT_S, doing="start")
                if msg[0] == "error":
                    reraise(msg[1])
                h.images, h.labels, events = msg[2], msg[3], msg[4]
                if events:
                    h.ready = [torch.cuda.Event.from_ipc_handle(self.device, x) for x in events]
                    h.released = [torch.cuda.Event(interprocess=True) for _ in events]
                    h.send("released", [e.ipc_handle() for e in h.released])
        except BaseException:
            _close_all(handles)
            raise
        self._handles = handles
        self._finalizer = weakref.finalize(self, _close_all, handles)

    def _take(self, h: _Handle, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
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

    def epoch(self, epoch: int, start: int, count: int, remainder: tuple[int, Remainder] | None,
              stats: StageStats) -> Generator[tuple[torch.Tensor, torch.Tensor, list[str]], None, None]:
        """Batches ``start .. count - 1`` of ``epoch`` as ``(images, labels, keys)``, in order.

        Stats: the feeders' counters, and this process's wait (``wait_s``), hand-over (``copy_s``)
        and delivery (``elapsed_s``) times. Closing the iterator early stops the feeders' epoch.
        """
        if not self._handles:
            self._start()
        for h in self._handles:
            h.send("epoch", epoch, start, remainder)
        ended: set[int] = set()
        try:
            last = time.perf_counter()
            for i in range(count - start):
                h = self._handles[feeder_of(i, num_workers=self.workers, parts=self.parts)]
                t0 = time.perf_counter()
                msg = h.recv()
                if msg[0] == "error":
                    ended.add(h.part)
                    reraise(msg[1])
                if msg[0] != "batch":
                    ended.add(h.part)
                    raise LoaderError(f"feeder process {h.part} ended epoch {epoch} early ({i} of {count - start} "
                                      "batches delivered)")
                _, k, n, keys, feeder_stats = msg
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
            for h in self._handles:  # each feeder ends its part
                msg = h.recv()
                ended.add(h.part)
                if msg[0] == "error":
                    reraise(msg[1])
                if msg[0] != "end":
                    raise LoaderError(f"feeder process {h.part} delivered more batches than epoch {epoch} has")
        finally:
            self._stop(skip=ended)

    def _stop(self, skip: set[int]) -> None:
        """Make every feeder not in ``skip`` abandon the epoch, and drop what it sent meanwhile
        (a batch's slot goes straight back). A feeder that is dead or does not answer within
        :data:`STOP_TIMEOUT_S` stops the pool: the next epoch starts new feeders."""
        broken = False
        for h in self._handles:
            if h.part in skip:
                continue
            try:
                h.send("stop")
                while True:
                    msg = h.recv(timeout=STOP_TIMEOUT_S, doing="stop")
                    if msg[0] == "batch":
                        h.send("free", msg[1])
                    elif msg[0] == "stopped":
                        break  # "end" or "error" sent before the stop arrived: its answer follows
            except LoaderError:
                broken = True
        if broken:
            self.close()

    def close(self) -> None:
        """Stop the feeder processes (idempotent; a later epoch starts new ones)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._handles = []
