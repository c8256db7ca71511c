"""A feeder process's side (see :mod:`~shardkit.loader.feed.pool` for why and how the loader uses it):
its part of the route, its workers, its ring of slots, and the messages it answers.

**Messages** (one duplex pipe per feeder; ``gen`` numbers the loader's epochs, so a message
left over from an abandoned epoch is recognised and dropped). To the feeder: ``("epoch", gen,
epoch, start, remainder)``, ``("free", slot)``, ``("released", handles)``, ``("stop", gen)``
(abandon that epoch, answered by ``("stopped", gen)``) and ``("close",)``. From it:
``("started", pid, images, labels, handles)`` (its ring) once, then ``("batch", gen, slot, n, keys,
stats)``, ``("end", gen)``, ``("error", gen, failure)`` and ``("stopped", gen)``. Every slot is
free again when an epoch starts (the loader holds none then: it copies each batch out at once).
A feeder exits when its pipe closes or the training process is gone, so none outlives it.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.multiprocessing  # registers the reductions that send CUDA and shared tensors through pipes

from shardkit.codec.backend import prefer_decoder
from shardkit.errors import LoaderError, ShardkitError
from shardkit.index.manifest import Manifest
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.remainder import Remainder
from shardkit.loader.feed.cuda_sync import sleep_while_waiting
from shardkit.loader.feed.labels import SlotLabels
from shardkit.loader.feed.layout import part_batches
from shardkit.loader.feed.logs import relay_to
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.choose import mark_warned
from shardkit.loader.routes.segments import share_
from shardkit.loader.routes.spec import RouteSpec
from shardkit.loader.run.epoch_run import EpochRun
from shardkit.loader.run.stream import BatchStream, WorkerFailure
from shardkit.loader.stats import StageStats
from shardkit.loader.threads import name_this_thread
from shardkit.transforms.base import ImageTransform

__all__ = ["RING", "FeederSpec", "feeder_main"]

#: Ring slots per feeder: batches it may have finished ahead of the training loop.
RING = 4


@dataclass(frozen=True)
class FeederSpec:
    """What a feeder process needs to run its part of the route (pickled to it once).
    ``decoder``: the library :func:`~shardkit.codec.backend.prefer_decoder` chose in the loader's
    process when the loader was built (a process-wide setting the feeder must repeat; the GPU
    decoder is chosen when a loader is built). ``labels``: what a slot holds beside the images
    (a captioned batch's token tensor: :func:`~shardkit.loader.feed.labels.probe_text`)."""

    manifest: Manifest
    reader: ShardReader
    route: RouteSpec  # the loader's, with this feeder's workers (RouteSpec.with_workers)
    config: PlanConfig
    part: int
    parts: int
    total_workers: int  # all feeders' workers
    decoder: str | None = None
    read_ahead: bool = False  # workers and route go on into the next epoch (see shardkit.loader.run.epoch_run)
    labels: SlotLabels = SlotLabels()


class _Stop(Exception):
    """End this epoch's iteration: the loader abandoned it, closed the feeder (``close``) or
    started another epoch (``restart``: that message, to run next)."""

    def __init__(self, close: bool = False, restart: tuple[Any, ...] | None = None) -> None:
        super().__init__("stop")
        self.close, self.restart = close, restart


def _failure(err: BaseException, part: int) -> WorkerFailure:
    """An error of feeder ``part`` as a record the loader re-raises: ShardkitErrors with their type
    (a dead worker's named as in this feeder), anything else as a LoaderError naming the feeder."""
    if isinstance(err, ShardkitError):
        message = err.message
        if message.startswith("DataLoader worker"):  # worker_death: its numbers are this feeder's
            message = f"in feeder process {part}: {message}"
        return WorkerFailure(type(err), message, err.where, traceback.format_exc())
    return WorkerFailure(LoaderError, f"feeder process {part} failed: {type(err).__name__}: {err}", "",
                         traceback.format_exc())


def _watch_parent(parent: int) -> None:
    """Exit when the training process (pid ``parent``) is gone: its pipe may stay open in a
    process it forked. A feeder's own parent may be a forkserver, so the training process is
    watched by pid: through a pidfd where Linux has them (readable once it exits; a reused pid
    cannot be mistaken for it), else by polling whether the pid still exists."""
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # not Linux 5.3+, or it is gone already
        pidfd = None
    if pidfd is not None:
        select.select([pidfd], [], [])
        os._exit(1)
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # alive, another user's (cannot happen to our parent; harmless)
            pass


class _Feeder:
    """The feeder's side: its route, workers, ring and pipe (runs in :func:`feeder_main`)."""

    def __init__(self, spec: FeederSpec, conn: Any) -> None:
        from shardkit.loader.routes.choose import choose_route
        from shardkit.loader.run.workers import worker_loader

        self.spec, self.conn = spec, conn
        self.route = choose_route(spec.manifest, spec.reader, spec.route)
        self.device = self.route.device
        self.cuda = self.device.type == "cuda"
        self.control = torch.zeros(2, dtype=torch.int64).share_memory_()
        self.stream = BatchStream(spec.config, self.route.builder, self.control,
                                  layout=(spec.part, spec.parts, spec.total_workers), read_ahead=spec.read_ahead)
        # workers forked from this process, as a loader's are from the training process (a
        # feeder would otherwise start them as it started: a second torch import each)
        fork = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        self.dataloader = worker_loader(self.stream, num_workers=spec.route.num_workers, prefetch=spec.route.prefetch,
                                        pin_memory=self.route.pin_memory, context=fork)
        self.stats = StageStats()  # the route's threads add to it while batches are handed over
        self._sent = StageStats()  # a copy of stats as of the last batch handed over (or dropped)
        self.run = EpochRun(self.route, self.stream, self.control, self.dataloader, self.stats)
        self.ring: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ready: list[torch.cuda.Event] = []
        self.released: list[torch.cuda.Event] | None = None
        self.free: deque[int] = deque()
        self.gen: int | None = None  # the epoch being run (None: idle)
        self.pending: tuple[Any, ...] | None = None  # an epoch message that arrived during another

    # -- messages
    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "free":
            if msg[1] not in self.free:
                self.free.append(msg[1])
        elif kind == "released":
            self.released = [torch.cuda.Event.from_ipc_handle(self.device, h) for h in msg[1]]
        elif kind == "stop":
            if self.gen is not None and msg[1] == self.gen:
                raise _Stop()
            self.conn.send(("stopped", msg[1]))  # an epoch that already ended here
        elif kind == "close":
            raise _Stop(close=True)
        elif kind == "epoch":
            raise _Stop(restart=msg)
        else:
            raise RuntimeError(f"unexpected message {kind!r}")

    def _slot(self) -> int:
        while self.conn.poll():
            self._handle(self.conn.recv())
        while not self.free:
            self._handle(self.conn.recv())
        return self.free.popleft()

    # -- the ring
    def make_ring(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[bytes]]:
        """The ring, made before any thread of the route runs (sharing CUDA memory while the
        decode thread ran nvJPEG crashed torch's ``_share_cuda_`` once on an H200): slots shaped
        and laid out as the transform's finalised batches, beside them the labels or token ids
        of :attr:`FeederSpec.labels`."""
        transform = self.spec.route.transform
        assert isinstance(transform, ImageTransform)  # feeders need one (arguments.feeder_slots)
        b, (h, w) = self.spec.route.batch_size, transform.output_size
        probe = transform.finalize(torch.zeros((1, 3, h, w), dtype=torch.uint8, device=self.device))
        last = probe.is_contiguous(memory_format=torch.channels_last) and not probe.is_contiguous()
        fmt = torch.channels_last if last else torch.contiguous_format
        # one allocation for all the slots' images and one for their labels: the training process
        # opens each shared allocation once (a CUDA IPC open can take tens of milliseconds)
        images = torch.empty((RING * b, 3, h, w), dtype=probe.dtype, device=self.device, memory_format=fmt)
        labels = self.spec.labels.empty(RING * b, self.device)
        if not self.cuda:
            images, labels = share_(images), share_(labels)  # on Linux outside /dev/shm
        self.ring = [(images[k * b:(k + 1) * b], labels[k * b:(k + 1) * b]) for k in range(RING)]
        handles: list[bytes] = []
        if self.cuda:
            self.ready = [torch.cuda.Event(interprocess=True) for _ in range(RING)]
            handles = [e.ipc_handle() for e in self.ready]
        return [r[0] for r in self.ring], [r[1] for r in self.ring], handles

    def _hand_over(self, images: torch.Tensor, labels: torch.Tensor, keys: list[str]) -> None:
        slot_images = self.ring[0][0]
        n = images.shape[0] if isinstance(images, torch.Tensor) else -1
        if (not isinstance(images, torch.Tensor) or images.shape[1:] != slot_images.shape[1:]
                or images.dtype != slot_images.dtype or n > slot_images.shape[0]):
            what = (f"{tuple(images.shape)} {images.dtype}" if isinstance(images, torch.Tensor)
                    else type(images).__name__)
            raise LoaderError(f"a batch of {what} does not fit the feeders' slots of {tuple(slot_images.shape)} "
                              f"{slot_images.dtype}; use feeders=0")
        self.spec.labels.check(labels, n)
        k = self._slot()
        slot_images, slot_labels = self.ring[k]
        if self.cuda:
            stream = torch.cuda.current_stream(self.device)
            while self.released is None:  # sent right after the ring arrived, before any "free"
                self._handle(self.conn.recv())
            stream.wait_event(self.released[k])  # a no-op for an event never recorded
            slot_images[:n].copy_(images, non_blocking=True)
            slot_labels[:n].copy_(labels, non_blocking=True)
            self.ready[k].record(stream)
        else:
            slot_images[:n].copy_(images)
            slot_labels[:n].copy_(labels)
        now = copy.copy(self.stats)
        self.conn.send(("batch", self.gen, k, n, keys, now.since(self._sent)))
        self._sent = now

    # -- epochs
    def epoch(self, gen: int, epoch: int, start: int, rest: Remainder | None) -> bool:
        """Run one epoch's part; False when the loader closed this feeder meanwhile."""
        from shardkit.loader.run.workers import worker_death

        spec = self.spec
        mine = part_batches(spec.config.epoch_batches(rest) - start, part=spec.part, parts=spec.parts,
                            num_workers=spec.total_workers)
        self.gen, self.free = gen, deque(range(RING))
        delivered = self.run.open(epoch, start, rest)
        try:
            for _ in range(mine):
                item = next(delivered, None)
                if item is None:
                    raise LoaderError(f"workers ended epoch {epoch} early in feeder process {spec.part}")
                self._hand_over(*item)
            self.conn.send(("end", gen))
            self.run.keep(delivered, epoch)  # with read-ahead, on into the next epoch
        except _Stop as stop:
            delivered.close()
            self._sent = copy.copy(self.stats)  # the counters of a batch never handed over, as an undelivered batch's
            if stop.close:
                return False
            if stop.restart is not None:
                self.pending = stop.restart
            else:
                self.conn.send(("stopped", gen))
        except Exception as err:
            delivered.close()
            death = worker_death(self.dataloader)
            if death is not None:  # the next epoch starts new workers
                self.run.stop_workers()
            self.conn.send(("error", gen, _failure(death if death is not None else err, self.spec.part)))
        finally:
            self.gen = None
        return True

    def serve(self) -> None:
        while True:
            msg, self.pending = (self.pending, None) if self.pending is not None else (self.conn.recv(), None)
            if msg[0] == "epoch":
                if not self.epoch(*msg[1:]):
                    return
                continue
            try:
                self._handle(msg)
            except _Stop as stop:
                if stop.close:
                    return

    def close(self) -> None:
        self.route.close()
        self.run.stop_workers()
        self.spec.reader.close()


def feeder_main(part: int, payload: bytes, device_index: int | None, parent: int, conn: Any, logs: Any,
                log_levels: dict[str, int], warned: frozenset[str]) -> None:
    """Feeder ``part``'s body (see the module doc): ``payload`` is its pickled
    :class:`FeederSpec`, ``device_index`` the CUDA device current in the loader's process when it
    started its feeders; its log records (and its workers') go to the queue ``logs``, handled in
    the training process (:mod:`shardkit.loader.feed.logs`), at its ``log_levels``; the route
    warnings it gave already (``warned``) are not given again. Ctrl-C is
    the training process's to handle (it stops its feeders); a feeder whose pipe closes, or whose
    parent is gone, exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name_this_thread(f"sk-feeder{part}")  # what top and ps show for this process
    relay_to(logs, log_levels)
    mark_warned(warned)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="shardkit-watch-parent").start()
    feeder: _Feeder | None = None
    try:
        spec: FeederSpec = pickle.loads(payload)
        if device_index is not None:
            sleep_while_waiting(device_index)  # before its context exists (set_device creates it)
            spec = replace(spec, route=spec.route.on(torch.device("cuda", device_index)))
            torch.cuda.set_device(device_index)
        prefer_decoder(spec.decoder)
        feeder = _Feeder(spec, conn)
        conn.send(("started", os.getpid(), *feeder.make_ring()))
        feeder.serve()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the training process is gone
    except BaseException as err:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", None, _failure(err, part)))
    finally:
        if feeder is not None:
            feeder.close()
