"""A delivery route: how one kind of batch gets from the worker processes to the user.

:class:`~shardkit.loader.ShardLoader` owns the epoch, the plan, the workers and the resume
state; a :class:`Route` owns what a batch *is* on its way:

- the **worker half**, :attr:`Route.builder`: a picklable :class:`Builder` that turns one
  batch's ``(shard, index, seed)`` triples into the route's worker payload (a typed batch with
  ``keys`` and ``stats``). It runs in the worker processes (or in the loader's process when
  ``num_workers=0``).
- the **host half**, :meth:`Route.deliver`: turns the stream of worker payloads into what the
  user iterates, ``(images, labels_or_targets, keys)``. Routes say how in two steps:
  :meth:`Route.prepare` (a host pipeline over the whole stream: the GPU route's device
  prefetcher; by default the stream itself) and :meth:`Route.finish` (one batch to the device,
  finalised). :meth:`deliver` times both and adds the batch's counters to the loader's stats,
  the same way for every route.
- **lifecycle**: :meth:`Route.before_workers` runs just before worker processes start,
  :meth:`Route.workers_started` once they run (the GPU route compiles its kernel then) and
  :meth:`Route.workers_stopped` just after they stopped (for buffers shared with them);
  :meth:`Route.close` when the loader closes, before its workers stop.

The three routes are :mod:`shardkit.loader.routes.cpu`, :mod:`shardkit.loader.routes.gpu` and
:mod:`shardkit.loader.routes.coco`; :func:`shardkit.loader.routes.choose.choose_route` picks one.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator
from typing import Any, Generic, TypeVar

import torch

from shardkit.loader.routes.batch import Builder, WorkerBatch
from shardkit.loader.stats import StageStats

__all__ = ["DirectRoute", "Route", "map_tensors", "to_device"]

W = TypeVar("W", bound=WorkerBatch)  # what the worker half ships
R = TypeVar("R", bound=WorkerBatch)  # what the host pipeline hands to finish()


class Route(ABC, Generic[W, R]):
    """One delivery route (see the module doc). Subclasses set :attr:`builder` and
    :attr:`device`, and implement :meth:`prepare` and :meth:`finish` (routes without a host
    pipeline derive from :class:`DirectRoute`)."""

    #: The worker half (travels to the worker processes).
    builder: Builder[W]
    #: Where batches are delivered.
    device: torch.device
    #: Whether worker batches should arrive in page-locked memory (DataLoader's pin thread).
    pin_memory: bool = False
    #: Class names by label, where the dataset names them (see ``ShardLoader.classes``).
    classes: tuple[str, ...] | None = None
    #: Category id -> label when the route renumbers labels (COCO ``contiguous_labels``).
    label_map: dict[Any, int] | None = None

    def before_workers(self) -> None:
        """Called when worker processes are about to start (none runs now)."""

    def workers_started(self) -> None:
        """Called once an epoch's worker processes run (or, with none, its stream is opened),
        before its first batch is waited for; from the thread that reads the workers. The workers
        were forked before it, and a later start of workers first waits for the kernel compiles
        started here (:mod:`shardkit.transforms.gpu_ahead`)."""

    def workers_stopped(self) -> None:
        """Called when the loader has stopped its worker processes (batches in flight are gone)."""

    @abstractmethod
    def prepare(self, batches: Iterator[W], stats: StageStats) -> Iterator[R]:
        """The host pipeline between the workers and :meth:`finish`."""

    @abstractmethod
    def finish(self, batch: R) -> tuple[Any, Any]:
        """``(images, labels or targets)`` of one batch, on :attr:`device`, as the user gets them."""

    def deliver(self, batches: Iterator[W], stats: StageStats
                ) -> Generator[tuple[Any, Any, list[str]], bool | None, None]:
        """``(images, labels or targets, keys)`` per worker batch, in order.

        Adds each batch's counters to ``stats``, and the time spent waiting for it
        (``wait_s``), finishing it (``copy_s``) and between deliveries (``elapsed_s``, which
        includes the consumer's own time: throughput as training sees it). ``send(True)`` in
        place of ``next``: the time since the last delivery is not the loader's (a delivery
        taken over for the next epoch, :mod:`~shardkit.loader.run.epoch_run`).
        """
        ready = self.prepare(batches, stats)
        last = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            batch = next(ready, None)
            if batch is None:
                return
            t1 = time.perf_counter()
            images, labels = self.finish(batch)
            t2 = time.perf_counter()
            stats.add(batch.stats)
            stats.wait_s += t1 - t0
            stats.copy_s += t2 - t1
            stats.elapsed_s += t2 - last
            last = t2
            if (yield images, labels, batch.keys):
                last = time.perf_counter()

    def close(self) -> None:
        """Stop the route's host-side work (threads); called before the workers stop. Idempotent."""

    def release(self) -> None:
        """:meth:`close`, and drop what the route keeps between iterations (staging memory), as
        when feeder processes take it over; it is made again if the route runs again here."""
        self.close()


class DirectRoute(Route[W, W]):
    """A route whose worker batches go to :meth:`finish` as they arrive (no host pipeline)."""

    def prepare(self, batches: Iterator[W], stats: StageStats) -> Iterator[W]:
        return batches


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it, inside lists, tuples (named too) and
    dicts; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def to_device(value: Any, device: torch.device) -> Any:
    """Move every tensor inside lists, tuples (named too) and dicts to ``device``."""
    return map_tensors(value, lambda t: t.to(device, non_blocking=True))
