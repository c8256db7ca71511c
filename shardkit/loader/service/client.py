"""The training process's side of the service: start the workers, ask for batches, deliver them in order.

**Driven by the training process.** Batch ``i`` of an epoch is a pure function of the plan
(:meth:`~shardkit.loader.epochs.config.PlanConfig.batch`: its samples) and the seed
(:func:`~shardkit.loader.epochs.seeds.sample_seeds`: their augmentation), so the training process
computes both and asks any worker to build it (:meth:`BatchActor.build`). It keeps the next
``in_flight`` batches asked for (back-pressure: the object store holds at most that many), each
of the least busy worker, and takes them in order: the batches, order and augmentation of local
workers, whatever worker built which batch. With read-ahead (the loader's ``read_ahead``) the
window runs on into the next epoch's first batches as this one ends, so an epoch does not start
with idle workers; the next epoch takes them over when it starts from its beginning.

**Faults.** A batch whose worker died (its process killed, its node lost: Ray raises
``RayActorError`` or ``ObjectLostError``) or that takes longer than ``batch_timeout_s`` once due
is asked again of another worker, as is every other batch that worker still owed; each is
delivered once, when it arrives, so nothing is lost or repeated. The lost worker is killed and
a replacement started; it takes batches once it has started (its node may have gone: Ray places
it when a CPU is free). A batch lost more than ``retries`` times, or no worker left for
``start_timeout_s``, ends the iteration with a :class:`~shardkit.errors.LoaderError`; so does the
whole cluster gone (its head node's GCS refusing connections), at once, and the process
disconnects from it, since Ray would otherwise end the process a minute later. An error
raised building a batch (a damaged shard with ``on_error="raise"``, a bug in a transform) is not
a fault of the worker: it is raised in the training process as it would be with local workers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit._version import __version__
from shardkit.errors import LoaderError
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.remainder import Remainder
from shardkit.loader.epochs.seeds import sample_seeds
from shardkit.loader.read.reader import ReaderPart
from shardkit.loader.routes.cpu.worker import CpuBatch, CpuBatchBuilder
from shardkit.loader.service.actor import BatchActor, DatasetCheck, Started
from shardkit.loader.service.connect import cluster_gone, connect, disconnect
from shardkit.loader.service.options import RayService
from shardkit.loader.service.payload import Failure, from_payload, raise_failure
from shardkit.serve import SERVICE_RESOURCE

__all__ = ["ServiceClient", "dataset_checks"]

log = logging.getLogger("shardkit.loader")


@dataclass(eq=False)
class _Worker:
    handle: Any
    ready: Any  # the ref of its start() report
    started: Started | None = None  # None: not started yet
    busy: int = 0  # batches asked of it and not taken yet


@dataclass(eq=False)
class _Job:
    epoch: int
    index: int
    samples: tuple[list[int], list[int], list[int]]  # shards, indices, seeds
    ref: Any = None
    worker: _Worker | None = None
    lost: int = 0


class ServiceClient:
    """The workers of ``service`` building batches with ``builder`` (see the module doc).

    ``datasets``: what each worker checks before it serves; ``writable``: batches are delivered on
    the CPU, so their tensors are copied out of Ray's read-only object store; ``read_ahead``: the
    window runs on into the next epoch (see :meth:`batches`).

    Raises:
        LoaderError: the cluster cannot be reached, has fewer CPUs than the workers need, or a
            worker cannot start or read the datasets within ``start_timeout_s`` (naming its node).
    """

    def __init__(self, service: RayService, builder: CpuBatchBuilder, datasets: Sequence[DatasetCheck], *,
                 writable: bool, read_ahead: bool = True) -> None:
        self.service, self.writable, self.read_ahead = service, writable, read_ahead
        self._kept: tuple[PlanConfig, int, deque[_Job]] | None = None  # read ahead: (config, epoch, its first jobs)
        ray = self._ray = connect(service.address, timeout=service.connect_timeout_s)
        self._gone = ""  # why the cluster is gone, once it is: this process disconnected from it
        #: Batches delivered, by the id of the node that built them.
        self.nodes: Counter[str] = Counter()
        #: Workers lost (and replaced) so far.
        self.restarts = 0
        self._live: list[_Worker] = []
        self._starting: list[_Worker] = []
        total = ray.cluster_resources()
        resources = {SERVICE_RESOURCE: service.cpus_per_worker} if total.get(SERVICE_RESOURCE) else {}
        have = total.get(SERVICE_RESOURCE) or total.get("CPU", 0)
        need = service.workers * service.cpus_per_worker
        if need > have:
            what = f"{SERVICE_RESOURCE} (CPUs of `shardkit serve` nodes)" if resources else "CPUs"
            raise LoaderError(f"RayService(workers={service.workers}) needs {need:g} CPUs, the cluster at "
                              f"{service.address} has {have:g} {what}: add nodes or ask for fewer workers")
        self._actor = ray.remote(BatchActor).options(
            num_cpus=service.cpus_per_worker, resources=resources, max_restarts=0, max_task_retries=0,
            scheduling_strategy="SPREAD")
        self._args = (ray.put(builder), list(datasets), __version__)
        self.start()

    def start(self) -> None:
        """Start the workers and wait until every one can serve (nothing when they run).

        Raises:
            LoaderError: a worker cannot start or read the datasets, or not all start within
                ``start_timeout_s`` (the workers started are stopped again).
        """
        if self._live or self._starting:
            return
        self._check_connected()
        try:
            self._starting = [self._spawn() for _ in range(self.service.workers)]
            self._await_start()
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> list[Started]:
        """The live workers: node id and process id of each."""
        return [w.started for w in self._live if w.started is not None]

    def _check_connected(self) -> None:
        """Refuse to go on once this process is no longer connected to the cluster (it went, and
        this or another loader disconnected from it): a Ray call now would start a local cluster of
        its own and run the service's workers on this machine's CPUs."""
        if not self._gone and not self._ray.is_initialized():
            self._gone = "this process is no longer connected to the service's Ray cluster"
        if self._gone:
            raise LoaderError(f"{self._gone}: build the loader again once the cluster runs")

    def _spawn(self) -> _Worker:
        handle = self._actor.remote(*self._args)
        return _Worker(handle, handle.start.remote())

    def _await_start(self) -> None:
        """Wait for every worker to start (raises naming the first that cannot serve, or the count started)."""
        ray, limit = self._ray, self.service.start_timeout_s
        refs = [w.ready for w in self._starting]
        ray.wait(refs, num_returns=len(refs), timeout=limit)
        self._promote(strict=True)
        if self._starting:
            raise LoaderError(f"{len(self._live)} of {self.service.workers} service workers started within "
                              f"{limit:g} s: the cluster has too few free CPUs for them, or its nodes are slow to "
                              f"start Python (`ray status` shows what is used)")

    def _promote(self, *, strict: bool = False) -> None:
        """Move started workers to the live ones; one that cannot serve is dropped (``strict``: raised)."""
        if not self._starting:
            return
        ray = self._ray
        done, _ = ray.wait([w.ready for w in self._starting], num_returns=len(self._starting), timeout=0)
        for worker in [w for w in self._starting if w.ready in done]:
            self._starting.remove(worker)
            try:
                started: Started = ray.get(worker.ready)
            except ray.exceptions.RayError as err:
                problem = f"could not start ({_first_line(err)}); is shardkit installed on every node?"
                started = Started("?", 0, problem)
            if started.problem is None:
                worker.started = started
                self._live.append(worker)
                continue
            self._kill(worker)
            message = f"the service worker on node {started.node[:12]} {started.problem}"
            if strict:
                raise LoaderError(message)
            log.warning("shardkit: %s; it is not used", message)

    def batches(self, config: PlanConfig, epoch: int, start: int,
                rest: Remainder | None) -> Generator[CpuBatch, None, None]:
        """This rank's batches ``start`` to the end of ``epoch`` (of what ``rest`` leaves of it), in order.

        With ``read_ahead``, the window runs on into the next epoch's first batches while this one
        ends; those are kept for the next call when it asks for exactly that epoch from its start
        (a batch is the same whenever it is built), and cancelled otherwise.

        Raises:
            LoaderError: a batch was lost more than ``retries`` times, or no worker is left.
            ShardkitError: raised building a batch (as with local workers).
        """
        self._check_connected()
        self.start()
        pending, asks = self._take_over(config, epoch, start, rest)
        count = config.epoch_batches(rest)
        try:
            for _ in range(start, count):
                while len(pending) < self.service.window and (job := next(asks, None)) is not None:
                    self._submit(job)
                    pending.append(job)
                yield self._take(pending)
        finally:
            ahead = deque(job for job in pending if job.epoch == epoch + 1)
            self._drop(deque(job for job in pending if job.epoch != epoch + 1))
            if ahead and self.read_ahead:
                self._kept = (config, epoch + 1, ahead)
            else:
                self._drop(ahead)

    def _asks(self, config: PlanConfig, epoch: int, start: int, rest: Remainder | None) -> Iterator[_Job]:
        """The batches to ask for, in order: ``epoch``'s from ``start``, then (read-ahead) the next epoch's."""
        order = config.order(epoch)
        for index in range(start, config.epoch_batches(rest)):
            shards, indices, positions = config.batch(order, index, rest)
            seeds = sample_seeds(config.seed, epoch, positions)
            yield _Job(epoch, index, (shards.tolist(), indices.tolist(), seeds.tolist()))
        if self.read_ahead:
            yield from self._asks(config, epoch + 1, 0, None) if config.epoch_batches(None) else ()

    def _take_over(self, config: PlanConfig, epoch: int, start: int,
                   rest: Remainder | None) -> tuple[deque[_Job], Iterator[_Job]]:
        """The kept batches when they begin exactly what is asked for (dropped otherwise), and what to ask next."""
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] is config and kept[1] == epoch and start == 0 and rest is None:
            pending = kept[2]
            return pending, self._asks(config, epoch, len(pending), rest)
        if kept is not None:
            self._drop(kept[2])
        return deque(), self._asks(config, epoch, start, rest)

    def _submit(self, job: _Job) -> None:
        worker = self._least_busy()
        job.worker, job.ref = worker, worker.handle.build.remote(*job.samples)
        worker.busy += 1

    def _least_busy(self) -> _Worker:
        self._promote()
        deadline = time.monotonic() + self.service.start_timeout_s
        while not self._live:
            if not self._starting or time.monotonic() > deadline:
                raise LoaderError(f"every service worker was lost and none could be restarted within "
                                  f"{self.service.start_timeout_s:g} s (`ray status` shows the cluster's nodes)")
            self._ray.wait([w.ready for w in self._starting], num_returns=1,
                           timeout=max(0.0, deadline - time.monotonic()))
            self._promote()
        return min(self._live, key=lambda w: w.busy)

    def _take(self, pending: deque[_Job]) -> CpuBatch:
        """The first pending batch, once built (asked again elsewhere while its workers are lost)."""
        ray, job = self._ray, pending[0]
        while True:
            try:
                out = ray.get(job.ref, timeout=self.service.batch_timeout_s)
            except ray.exceptions.GetTimeoutError:
                why = f"no batch within batch_timeout_s={self.service.batch_timeout_s:g} s"
            except ray.exceptions.RayTaskError as err:  # raised by the code, not a lost worker
                raise LoaderError(f"a service worker failed building batch {job.index} of epoch {job.epoch} "
                                  f"({_first_line(err)})") from err
            except ray.exceptions.RayError as err:
                why = f"{type(err).__name__}: {_first_line(err)}"
            else:
                break
            assert job.worker is not None
            self._lose(job.worker, why, pending)
        pending.popleft()
        worker, job.ref = job.worker, None
        assert worker is not None and worker.started is not None
        worker.busy -= 1
        if isinstance(out, Failure):
            raise_failure(out, f"batch {job.index} of epoch {job.epoch}")
        self.nodes[worker.started.node] += 1
        return from_payload(out, writable=self.writable)

    def _lose(self, worker: _Worker, why: str, pending: deque[_Job]) -> None:
        """``worker`` is lost: kill and replace it, and ask another for every batch it owed; or, when
        the whole cluster is gone, disconnect (Ray would end this process) and say so."""
        gone = cluster_gone(self._ray)
        if gone is not None:
            self._gone = f"the service's Ray cluster is gone ({gone})"
            disconnect(self._ray)
            raise LoaderError(f"{self._gone}; its workers went with it: start it again and resume from the loader's "
                              "state_dict(), or leave service= out to build batches in this process")
        owed = [job for job in pending if job.worker is worker]
        if worker in self._live:
            self._live.remove(worker)
            self.restarts += 1
            node = worker.started.node[:12] if worker.started is not None else "?"
            log.warning("shardkit: service worker on node %s lost (%s); its %d batches are built again elsewhere",
                        node, why, len(owed))
            self._kill(worker)
            self._starting.append(self._spawn())
        for job in owed:
            job.lost += 1
            if job.lost > self.service.retries:
                raise LoaderError(f"batch {job.index} of epoch {job.epoch} was lost with its service worker "
                                  f"{job.lost} times (last: {why}); retries={self.service.retries}")
            self._submit(job)

    def _kill(self, worker: _Worker) -> None:
        if self._gone or not self._ray.is_initialized():  # no Ray call: it would start a local cluster
            return
        with contextlib.suppress(Exception):  # it may be gone already
            self._ray.kill(worker.handle, no_restart=True)

    def _drop(self, pending: deque[_Job]) -> None:
        """Forget the batches asked for and not taken (an iteration left early): cancel them."""
        connected = not self._gone and self._ray.is_initialized()
        for job in pending:
            if job.ref is not None and connected:
                with contextlib.suppress(Exception):
                    self._ray.cancel(job.ref)
            if job.worker is not None:
                job.worker.busy -= 1
        pending.clear()

    def close(self) -> None:
        """Stop every worker (idempotent; the next epoch starts them again). The process stays
        connected to the cluster."""
        if self._gone or not self._ray.is_initialized():  # nothing to stop: no Ray call
            self._live, self._starting, self._kept = [], [], None
            return
        kept, self._kept = self._kept, None
        if kept is not None:
            self._drop(kept[2])
        for worker in [*self._live, *self._starting]:
            self._kill(worker)
        self._live, self._starting = [], []

    def __getstate__(self) -> Any:
        raise LoaderError("a loader with a service cannot be pickled or copied: build one in each process")


def dataset_checks(parts: Sequence[ReaderPart]) -> list[DatasetCheck]:
    """What each service worker checks of the datasets ``parts`` (see :meth:`BatchActor.start`).

    Raises:
        LoaderError: a dataset only this process can read (``memory://``).
    """
    checks, first = [], 0
    for part in parts:
        if part.store.process_local:
            raise LoaderError("memory:// is per process, so the service's workers cannot read it; use a directory "
                              "every node mounts or a shared URL (s3://, gs://, ...)", where=part.store.url)
        nonempty = np.flatnonzero(part.shards.num_samples)
        shard = first + int(nonempty[0]) if len(nonempty) else -1
        checks.append(DatasetCheck(part.store, part.shards.fingerprint, shard))
        first += len(part.shards)
    return checks


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__
