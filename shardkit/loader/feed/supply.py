"""Where a loader's route runs, epoch by epoch: in the training process, in feeder processes, or,
with ``feeders="auto"``, first here while the feeders start and then where the loop ran faster.

:class:`Supply` owns both places a route can run: the route in this process over its own worker
processes (an :class:`~shardkit.loader.run.epoch_run.EpochRun`) and the feeder processes (a
:class:`~shardkit.loader.feed.pool.FeederPool`). The loader asks it for each epoch's delivery
(:meth:`Supply.open`) and leaves the switching to it: the start behind the first batches, the
trial of :mod:`~shardkit.loader.feed.trial`, the hand-over, and the fall-back to this process
where feeders cannot run. Either place makes the same batches, so a switch between two batches
changes nothing the loop sees.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardkit.errors import LoaderError
from shardkit.loader.feed.pool import FeederPool
from shardkit.loader.feed.trial import DeviceStamp, PaceTrial, Place, Stamp
from shardkit.loader.routes.base import Route
from shardkit.loader.run.epoch_run import Delivery, EpochRun
from shardkit.loader.run.stream import BatchStream
from shardkit.loader.run.workers import worker_loader
from shardkit.loader.stats import StageStats

__all__ = ["Batches", "Supply"]

log = logging.getLogger("shardkit.loader")  # the loader's records: users (and tests) configure that name

#: An epoch's delivery: ``(images, labels or targets, keys)`` batch after batch.
Batches = Generator[tuple[Any, Any, list[str]], Any, None]


class Supply:
    """The route of a loader run in this process or in ``feeders`` feeder processes.

    ``make_pool(feeders)`` makes the pool of that many feeder processes (not started) for the
    loader's current plan;
    ``auto``: the loader's ``feeders="auto"`` (feeders that cannot run leave the route here with
    one warning instead of an error, and the trial picks the place); ``local``: the route may run
    here (False for a loader whose batches come from a preprocessing service).
    """

    def __init__(self, route: Route[Any, Any], stream: BatchStream[Any], control: torch.Tensor, stats: StageStats,
                 *, num_workers: int, prefetch: int, feeders: int, auto: bool,
                 make_pool: Callable[[int], FeederPool], local: bool = True) -> None:
        self.route, self.stream, self.control, self.stats = route, stream, control, stats
        self.num_workers, self.prefetch, self.auto, self.local = num_workers, prefetch, auto, local
        self._make_pool = make_pool
        #: Feeder processes running the route (0: it runs in this process).
        self.feeders = feeders
        #: Whether ``feeders="auto"`` has a trial: feeders planned, and none found unable to run.
        self.tries = auto and feeders > 0
        self.dataloader: DataLoader[Any] | None = None  # this process's workers
        self.run: EpochRun | None = None  # the route in this process
        self.pool: FeederPool | None = None
        self.trial = PaceTrial()  # feeders="auto": where the route runs best, timed once they are up
        # feeders="auto": batches served so far (the trial's phases go by it), the side that served
        # the last one, and how many that side has served since it took over
        self.served, self._side, self._since_switch = 0, "here", 0
        # feeders="auto" kept the route here during an epoch: its delivery there, which the loader
        # keeps for read-ahead once that epoch ran whole (take_tail)
        self._tail: Delivery | None = None
        self._auto_delivery: Batches | None = None  # the last delivery of feeders="auto" opened
        if feeders:
            try:
                self.pool = make_pool(feeders)
            except LoaderError as err:
                self._without_feeders(err)
        elif local:
            self._local_workers()

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a pickled loader) starts its next epoch afresh: no delivery travels
        return {**self.__dict__, "_tail": None, "_auto_delivery": None}

    @property
    def settled(self) -> bool:
        """Whether the batches come from where they stay (see ``ShardLoader.settled``)."""
        pool = self.pool
        return pool is None or not self.auto or (self.trial.decided is not None and pool.running)

    def open(self, epoch: int, start: int, count: int, rest: Any) -> tuple[Batches, Delivery | None]:
        """The delivery of batches ``start .. count - 1`` of ``epoch`` (``rest``: what an elastic
        resume left of it), and, when it is the route in this process alone, that delivery again
        (which :attr:`run` can keep on into the next epoch once it ran whole).

        Raises:
            LoaderError: feeders asked for by number could not start (naming why).
        """
        if self.pool is not None and not self.pool.running and not self.auto:
            self._start_feeders()  # asked for by number: started (or refused) before the first batch
        if self.pool is not None and self.auto and not self.settled:
            self._auto_delivery = self._auto(self.pool, epoch, start, count, rest)
            return self._auto_delivery, None  # "auto": no wait for them
        if self.pool is not None:
            return self.pool.epoch(epoch, start, count, rest, self.stats), None
        if not self.local:
            raise LoaderError("this loader's batches come from its preprocessing service, not from this process")
        if self.run is None:
            self._local_workers()
        assert self.run is not None
        local = self.run.open(epoch, start, rest)
        return local, local

    def finish(self, delivery: Batches) -> None:
        """``delivery`` (from :meth:`open`) gave its epoch's last batch: with feeders, take each
        one's end of its part (an extra batch is an error); ``feeders="auto"`` also ends its
        epoch (:meth:`take_tail`); the route here has nothing to end."""
        if self.pool is not None or delivery is self._auto_delivery:
            next(delivery, None)
        if delivery is self._auto_delivery:
            self._auto_delivery = None

    def take_tail(self) -> Delivery | None:
        """The delivery of the route in this process that ended an epoch of ``feeders="auto"``
        once its trial kept the route here, or None: the loader keeps it as it keeps any
        delivery here, so the workers read ahead into the next epoch from the first epoch
        after the trial on (without it, that epoch's first batch would wait for them to start)."""
        tail, self._tail = self._tail, None
        return tail

    def wait_for_feeders(self, timeout: float | None = None) -> bool:
        """See ``ShardLoader.wait_for_feeders``.

        Raises:
            LoaderError: feeders asked for by number could not start (naming why).
        """
        pool = self.pool
        if pool is None or pool.running:
            return True
        if not self.auto or (self.run is None and not pool.launched):
            self._start_feeders()  # before any batch: waits; "auto" that cannot start runs the route here
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if pool.poll_started():
                    return True
            except LoaderError as err:
                self._without_feeders(err)
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def relayout(self) -> None:
        """The loader's plan changed before its first epoch (its rank and world): its feeders
        (stopped first if :meth:`wait_for_feeders` started them) are made anew for it, and any
        trial starts over."""
        if self.pool is not None:
            self.pool.close()
            self.pool, self.trial = self._make_pool(self.feeders), PaceTrial()

    def close(self) -> None:
        """Stop the feeders and this process's workers (a later epoch starts them again)."""
        if self.pool is not None:
            self.pool.close()
        if self.run is not None:
            self.run.stop_workers()

    def _auto(self, pool: FeederPool, epoch: int, start: int, count: int, rest: Any) -> Batches:
        """``feeders="auto"`` until it has chosen where the route runs: batches ``start`` on of
        ``epoch``. While the feeders start, from the route in this process: from the second
        batch, once their forkserver is ready, they are launched (from this thread), and before
        each later batch their start messages are taken without waiting
        (:meth:`FeederPool.poll_started`). Once up, each side delivers the phases
        :class:`~shardkit.loader.feed.trial.PaceTrial` gives it by batch number while it times
        the loop, and the faster side stays (the same batches either way). Feeders that cannot
        start leave the route here, with one warning."""
        trial = self.trial
        trial.restart_clock()
        at, place, source = start, None, None
        try:
            while at < count:
                now, n = self._stamp() if trial.decided is None else 0.0, self.served
                up = self._up(pool, polling=self.served > 0 or pool.launched)  # from the loader's 2nd batch
                before = trial.decided
                trial.request(now, n, up=up)
                if trial.decided != before:
                    log.info("shardkit: %s", trial.summary(self.feeders))
                want = trial.place(n) if up else "here"
                fresh = want != place
                if fresh:
                    if source is not None:
                        source.close()
                    source, place = self._open(want, pool, epoch, at, count, rest), want
                    if want != self._side:
                        self._side, self._since_switch = want, 0
                if trial.decided == "here" and self.pool is pool:
                    self._keep_here(pool)
                elif trial.decided == "feeders" and place == "feeders" and self.run is not None:
                    self._hand_over()  # kept: the route here stops and drops its staging memory
                trial.fetching(n, want, since_switch=self._since_switch, fresh=fresh)
                assert source is not None
                item = next(source, None)
                if item is None:
                    return  # too few batches: the caller names the epoch and the count
                # counted as handed out: a loop that takes one batch per iteration closes this here
                at, self.served, self._since_switch = at + 1, self.served + 1, self._since_switch + 1
                yield item
            if place == "feeders" and source is not None:
                next(source, None)  # each feeder's end of its part (an extra batch would be an error)
            elif place == "here" and self.pool is None:  # the route stays here (kept by the trial, or no feeders)
                self._tail, source = source, None  # kept by the loader (take_tail): read-ahead from here on
        finally:
            if source is not None:
                source.close()

    def _stamp(self) -> Stamp:
        """When the loop asks for a batch, for the trial: on the device's timeline where the route
        delivers to a CUDA device (see :class:`~shardkit.loader.feed.trial.DeviceStamp`), else by
        the host's monotonic clock."""
        if self.route.device.type == "cuda":
            return DeviceStamp(self.route.device)
        return time.monotonic()

    def _up(self, pool: FeederPool, *, polling: bool) -> bool:
        """Whether the feeders deliver the next batch of :meth:`_auto`: not while they start (their
        start polled when ``polling``) or where they cannot (the route stays here)."""
        if self.pool is not pool:
            return False  # they could not start
        if not (polling or pool.running):
            return False
        try:
            return pool.poll_started()  # launches them first, once their forkserver is ready
        except LoaderError as err:
            self._without_feeders(err)  # "auto": the route stays here
            return False

    def _open(self, place: Place, pool: FeederPool, epoch: int, at: int, count: int, rest: Any) -> Batches:
        """The delivery of batches ``at`` on of ``epoch`` from ``place``."""
        if place == "here":
            if self.run is None:
                self._local_workers()
            assert self.run is not None
            return self.run.open(epoch, at, rest)
        log.debug("shardkit: feeder processes deliver epoch %d from batch %d", epoch, at)
        return pool.epoch(epoch, at, count, rest, self.stats)

    def _keep_here(self, pool: FeederPool) -> None:
        """The trial found the loop faster fed from this process: stop the feeders for good."""
        pool.close()
        self.pool, self.feeders = None, 0

    def _hand_over(self) -> None:
        """The feeders deliver from now on: stop the route in this process and its workers, and
        drop its staging memory."""
        assert self.run is not None
        self.run.stop_workers()
        self.route.release()
        self.run = self.dataloader = None

    def _start_feeders(self) -> None:
        """Start the feeder processes; with ``feeders="auto"``, a machine where they cannot run
        (CUDA IPC refused, no processes allowed) runs the route in this process instead, with
        one warning.

        Raises:
            LoaderError: feeders asked for by number could not start (naming why).
        """
        assert self.pool is not None
        try:
            self.pool.start()
        except LoaderError as err:
            self._without_feeders(err)

    def _without_feeders(self, why: LoaderError) -> None:
        """Feeders that cannot run (``why``): with ``feeders="auto"`` the route runs in this process,
        with one warning; asked for by number, ``why`` is raised."""
        if not self.auto:
            raise why
        log.warning("shardkit: feeder processes cannot run (%s); the route runs in this process", why)
        self.pool, self.feeders, self.tries = None, 0, False
        if self.run is None:
            self._local_workers()

    def _local_workers(self) -> None:
        """The worker processes of the route run in this process (none with ``num_workers=0``)."""
        if self.num_workers > 0:
            self.dataloader = worker_loader(self.stream, num_workers=self.num_workers, prefetch=self.prefetch,
                                            pin_memory=self.route.pin_memory)
        self.run = EpochRun(self.route, self.stream, self.control, self.dataloader, self.stats)
