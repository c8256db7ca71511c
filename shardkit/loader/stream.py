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
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardkit.errors import ShardkitError
from shardkit.loader.plan import (
    EpochOrder,
    batch_positions,
    num_batches,
    sample_seeds,
    stream_positions,
    worker_batch_indices,
)
from shardkit.loader.state import LoaderState, check_compatible, shards_digest
from shardkit.loader.worker_batch import Builder, WorkerBatch

W = TypeVar("W", bound=WorkerBatch)


@dataclass(frozen=True, eq=False)
class PlanConfig:
    """What the epoch plan of one rank depends on (besides the epoch).

    ``shard_sizes`` is held as a read-only int64 array (any int sequence is accepted): a plan's
    memory grows with the number of shards, never with the number of samples."""

    shard_sizes: npt.ArrayLike
    seed: int
    shuffle: bool
    window: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    even_batches: bool = True
    num_samples: int = field(init=False)
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        sizes = np.array(self.shard_sizes, dtype=np.int64, copy=True).reshape(-1)
        sizes.flags.writeable = False
        object.__setattr__(self, "shard_sizes", sizes)
        object.__setattr__(self, "num_samples", int(sizes.sum()))
        object.__setattr__(self, "digest", shards_digest(sizes))

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_samples, world_size=self.world_size, batch_size=self.batch_size,
                           drop_last=self.drop_last, even_batches=self.even_batches, rank=self.rank)

    def order(self, epoch: int) -> EpochOrder:
        """The lazy order of ``epoch`` (cheap: arrays of the number of shards)."""
        return EpochOrder(self.shard_sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle, window=self.window)

    def batch(self, order: EpochOrder, batch_index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shards, indices within them, seed positions)`` of this rank's batch ``batch_index``
        of ``order``'s epoch; the seed positions are the samples' places in the (padded) epoch
        stream, unique over ranks (see :func:`~shardkit.loader.plan.sample_seeds`)."""
        positions = stream_positions(self.num_samples, rank=self.rank, batch_index=batch_index,
                                     world_size=self.world_size, batch_size=self.batch_size,
                                     drop_last=self.drop_last, even_batches=self.even_batches)
        shards, indices = order.locate(positions % self.num_samples)
        seeds = np.asarray(batch_positions(self.rank, batch_index, num_batches=self.num_batches,
                                           batch_size=self.batch_size))[: positions.size]
        return shards, indices, seeds

    def state(self, epoch: int, consumed: int) -> LoaderState:
        """The resume state after ``consumed`` batches of ``epoch``."""
        return LoaderState(
            seed=self.seed, epoch=epoch, batches_consumed=consumed, num_samples=self.num_samples,
            shards_digest=self.digest, world_size=self.world_size,
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
            s, seed=self.seed, num_samples=self.num_samples, shards_digest=self.digest,
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
        order = cfg.order(epoch)
        for j in worker_batch_indices(cfg.num_batches, num_workers=workers, worker_id=worker, start_batch=start):
            shards, indices, positions = cfg.batch(order, j)
            seeds = sample_seeds(cfg.seed, epoch, positions)
            try:
                batch = self.builder.build(shards.tolist(), indices.tolist(), seeds.tolist())
            except ShardkitError as err:
                if info is None:  # in this process: the error keeps its own traceback
                    raise
                yield WorkerFailure(type(err), err.message, err.where, traceback.format_exc())
                return
            yield batch
