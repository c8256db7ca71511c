"""The batch stream one worker runs: this epoch's plan, this worker's batches, built in order.

A ``torch.utils.data.IterableDataset`` so torch's ``DataLoader`` can run it in persistent worker
processes. The epoch and resume point are read from a small shared-memory tensor at the start of
each iteration, which is how persistent workers learn about a new epoch.

A :class:`~shardkit.errors.ShardkitError` raised in a worker process is shipped to the main
process as a :class:`WorkerFailure` record (torch would otherwise re-raise it as its type built
from the whole traceback text, losing ``where``); :func:`raise_failures` re-raises it there with
its type, message and ``where``, chained to the worker's traceback.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardkit.errors import ShardkitError
from shardkit.loader.plan import (
    batch_positions,
    epoch_order,
    locate,
    num_batches,
    rank_batches,
    sample_seeds,
    shard_offsets,
    worker_batch_indices,
)
from shardkit.loader.state import LoaderState, check_compatible, shards_digest
from shardkit.loader.worker_batch import Builder, WorkerBatch

W = TypeVar("W", bound=WorkerBatch)


@dataclass(frozen=True)
class PlanConfig:
    """What the epoch plan of one rank depends on (besides the epoch)."""

    shard_sizes: tuple[int, ...]
    seed: int
    shuffle: bool
    window: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    even_batches: bool = True

    @property
    def num_samples(self) -> int:
        return sum(self.shard_sizes)

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_samples, world_size=self.world_size, batch_size=self.batch_size,
                           drop_last=self.drop_last, even_batches=self.even_batches, rank=self.rank)

    def batches(self, epoch: int) -> np.ndarray:
        """Global sample ids of this rank's batches in ``epoch``, shape ``[num_batches, B]``
        (``even_batches=False``: ``num_batches`` arrays, the last one may be short)."""
        order = epoch_order(self.shard_sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle, window=self.window)
        return rank_batches(order, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size,
                            drop_last=self.drop_last, even_batches=self.even_batches)

    def state(self, epoch: int, consumed: int) -> LoaderState:
        """The resume state after ``consumed`` batches of ``epoch``."""
        return LoaderState(
            seed=self.seed, epoch=epoch, batches_consumed=consumed, num_samples=self.num_samples,
            shards_digest=shards_digest(self.shard_sizes), world_size=self.world_size,
            batch_size=self.batch_size, drop_last=self.drop_last, shuffle=self.shuffle, window=self.window,
            even_batches=self.even_batches,
        )

    def resume(self, state: dict[str, Any]) -> tuple[int, int]:
        """``(epoch, next batch)`` to resume ``state`` at (a finished epoch: the next one's start).

        Raises:
            LoaderError: the state is malformed or was made for another configuration.
        """
        s = LoaderState.from_dict(state)
        check_compatible(
            s, seed=self.seed, num_samples=self.num_samples, shards_digest=shards_digest(self.shard_sizes),
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            shuffle=self.shuffle, window=self.window, even_batches=self.even_batches,
        )
        return s.resume_at(self.rank)


class WorkerTraceback(Exception):
    """The traceback of an error raised in a DataLoader worker, as text (the ``__cause__``)."""


@dataclass(frozen=True)
class WorkerFailure:
    """A :class:`ShardkitError` raised in a worker, as picklable data."""

    kind: type[ShardkitError]
    message: str
    where: str
    traceback: str


def raise_failures(source: Iterable[W | WorkerFailure]) -> Iterator[W]:
    """Pass ``source``'s batches on; re-raise a :class:`WorkerFailure` as its original error."""
    for item in source:
        if isinstance(item, WorkerFailure):
            raise item.kind(item.message, where=item.where) from WorkerTraceback(item.traceback)
        yield item


class BatchStream(IterableDataset[W | WorkerFailure], Generic[W]):
    """Yield this worker's batches of the epoch in ``control = [epoch, start_batch]``; in a
    worker process, a :class:`ShardkitError` ends the stream as a :class:`WorkerFailure`.

    ``builder``: the route's worker half (:class:`~shardkit.loader.route.Builder`)."""

    def __init__(self, config: PlanConfig, builder: Builder[W], control: torch.Tensor) -> None:
        self.config = config
        self.builder = builder
        self.control = control

    def __iter__(self) -> Iterator[W | WorkerFailure]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, start = int(self.control[0]), int(self.control[1])
        cfg = self.config
        batches = cfg.batches(epoch)
        shards, indices = locate(batches, shard_offsets(cfg.shard_sizes))
        for j in worker_batch_indices(len(batches), num_workers=workers, worker_id=worker, start_batch=start):
            positions = np.asarray(batch_positions(cfg.rank, j, num_batches=len(batches), batch_size=cfg.batch_size))
            seeds = sample_seeds(cfg.seed, epoch, positions)
            try:
                batch = self.builder.build(shards[j], indices[j], seeds.tolist())
            except ShardkitError as err:
                if info is None:  # in this process: the error keeps its own traceback
                    raise
                yield WorkerFailure(type(err), err.message, err.where, traceback.format_exc())
                return
            yield batch
