"""The batch stream one worker runs: this epoch's plan, this worker's batches, built in order.

A ``torch.utils.data.IterableDataset`` so torch's ``DataLoader`` can run it in persistent worker
processes. The epoch and resume point are read from a small shared-memory tensor at the start of
each iteration, which is how persistent workers learn about a new epoch.

*Read-ahead* (``read_ahead=True``): a worker does not stop at the end of the epoch but goes on
into the next ones, whole, so the workers (and the route's host pipeline behind them) prepare the
next epoch's first batches while the training loop finishes this one, instead of all of them
starting from empty when it asks. Each epoch is padded with :class:`EpochPadding` markers to a
whole number of rounds over the workers, so every epoch starts at worker 0 as a fresh start
would, and the batches, their order and their samples are those of epochs run one at a time.
:func:`raise_failures` drops the markers; whoever reads such a stream takes each epoch's
batches by count, as the loader does.

A :class:`~shardkit.errors.ShardkitError` raised in a worker process is shipped to the main
process as a :class:`WorkerFailure` record (torch would otherwise re-raise it as its type built
from the whole traceback text, losing ``where``); :func:`raise_failures` re-raises it there with
its type, message and ``where``, chained to the worker's traceback.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardkit.errors import LoaderError, ShardkitError
from shardkit.loader.mix import Mix, MixedOrder
from shardkit.loader.plan import (
    EpochOrder,
    Order,
    num_batches,
    stream_positions,
    worker_batch_indices,
)
from shardkit.loader.remainder import Remainder
from shardkit.loader.seeds import sample_seeds
from shardkit.loader.state import LoaderState, check_compatible, shards_digest
from shardkit.loader.worker_batch import Builder, WorkerBatch

W = TypeVar("W", bound=WorkerBatch)


@dataclass(frozen=True, eq=False)
class PlanConfig:
    """What the epoch plan of one rank depends on (besides the epoch).

    ``shard_sizes`` is held as a read-only int64 array (any int sequence is accepted): a plan's
    memory grows with the number of shards, never with the number of samples. ``mix``: several
    datasets (:class:`~shardkit.loader.mix.Mix`), whose joined shard sizes ``shard_sizes`` must be."""

    shard_sizes: npt.ArrayLike
    seed: int
    shuffle: bool
    window: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    even_batches: bool = True
    mix: Mix | None = None
    num_samples: int = field(init=False)
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        sizes = np.array(self.shard_sizes, dtype=np.int64, copy=True).reshape(-1)
        if self.mix is not None and not np.array_equal(sizes, self.mix.shard_sizes):
            raise LoaderError("shard_sizes must be the mix's joined shard sizes")
        sizes.flags.writeable = False
        object.__setattr__(self, "shard_sizes", sizes)
        object.__setattr__(self, "num_samples", int(sizes.sum()))
        object.__setattr__(self, "digest", shards_digest(sizes))

    @property
    def num_batches(self) -> int:
        """This rank's batches in a whole epoch."""
        return self.epoch_batches(None)

    def epoch_batches(self, remainder: Remainder | None) -> int:
        """This rank's batches in an epoch, or in what ``remainder`` leaves of one."""
        n = self.num_samples if remainder is None else len(remainder)
        return num_batches(n, world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
                           even_batches=self.even_batches, rank=self.rank)

    def order(self, epoch: int) -> Order:
        """The lazy order of ``epoch`` (cheap: arrays of the number of shards, or of the mix's slices)."""
        if self.mix is not None:
            return MixedOrder(self.mix, seed=self.seed, epoch=epoch, shuffle=self.shuffle, window=self.window)
        return EpochOrder(self.shard_sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle, window=self.window)

    def batch(self, order: Order, batch_index: int,
              remainder: Remainder | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shards, indices within them, seed positions)`` of this rank's batch ``batch_index``
        of ``order``'s epoch, or of what ``remainder`` leaves of it (an elastic resume lays the
        remainder out as an epoch of ``len(remainder)`` samples).

        Seed positions (for :func:`~shardkit.loader.seeds.sample_seeds`) are the samples' places
        in the padded epoch stream: the epoch position, plus ``N`` for each time the padding has
        wrapped around; unique over ranks, and the same in an exact resume.
        """
        n = self.num_samples if remainder is None else len(remainder)
        stream = stream_positions(n, rank=self.rank, batch_index=batch_index, world_size=self.world_size,
                                  batch_size=self.batch_size, drop_last=self.drop_last,
                                  even_batches=self.even_batches)
        positions = stream % n if remainder is None else remainder.positions(stream % n)
        shards, indices = order.locate(positions)
        return shards, indices, positions + self.num_samples * (stream // n)

    def state(self, epoch: int, consumed: int, remainder: Remainder | None = None) -> LoaderState:
        """The resume state after ``consumed`` batches of ``epoch`` (of ``remainder`` if given)."""
        return LoaderState(
            seed=self.seed, epoch=epoch, batches_consumed=consumed, num_samples=self.num_samples,
            shards_digest=self.digest, world_size=self.world_size,
            batch_size=self.batch_size, drop_last=self.drop_last, shuffle=self.shuffle, window=self.window,
            even_batches=self.even_batches, remainder=None if remainder is None else remainder.to_list(),
            mix=None if self.mix is None else self.mix.record(),
        )

    def resume(self, state: dict[str, Any]) -> tuple[int, int, Remainder | None]:
        """``(epoch, next batch, remainder)`` to resume ``state`` at.

        The same layout (world size, batch size, ``drop_last``, ``even_batches``): the state's own
        epoch and batch (a finished epoch: the next one's start). Another layout (an elastic
        resume): batch 0 of the :class:`Remainder` the state's ranks had not delivered, laid out
        for this loader; later epochs are whole again.

        Raises:
            LoaderError: the state is malformed or was made for another dataset, mix, seed or order.
        """
        s = LoaderState.from_dict(state)
        check_compatible(s, seed=self.seed, num_samples=self.num_samples, shards_digest=self.digest,
                         shuffle=self.shuffle, window=self.window, mix=None if self.mix is None else self.mix.record())
        layout = (self.world_size, self.batch_size, self.drop_last, self.even_batches)
        if (s.world_size, s.batch_size, s.drop_last, s.even_batches) == layout:
            epoch, start = s.resume_at(self.rank)
            carried = Remainder(s.remainder) if s.remainder is not None and epoch == s.epoch else None
            return epoch, start, carried
        rest = s.rest
        return (s.epoch, 0, rest) if len(rest) else (s.epoch + 1, 0, None)


class WorkerTraceback(Exception):
    """The traceback of an error raised in a DataLoader worker, as text (the ``__cause__``)."""


@dataclass(frozen=True)
class WorkerFailure:
    """A :class:`ShardkitError` raised in a worker, as picklable data."""

    kind: type[ShardkitError]
    message: str
    where: str
    traceback: str


@dataclass(frozen=True)
class EpochPadding:
    """Fills a read-ahead stream's epoch up to a whole round over the workers (see the module doc)."""


def raise_failures(source: Iterable[W | WorkerFailure | EpochPadding]) -> Iterator[W]:
    """Pass ``source``'s batches on, without the :class:`EpochPadding` of a read-ahead stream;
    re-raise a :class:`WorkerFailure` as its original error."""
    for item in source:
        if isinstance(item, WorkerFailure):
            reraise(item)
        if not isinstance(item, EpochPadding):
            yield item


def reraise(failure: WorkerFailure) -> NoReturn:
    """Raise the error ``failure`` records, with its type, message and ``where``, chained to its traceback."""
    raise failure.kind(failure.message, where=failure.where) from WorkerTraceback(failure.traceback)


class BatchStream(IterableDataset[W | WorkerFailure | EpochPadding], Generic[W]):
    """Yield this worker's batches of the epoch in ``control = [epoch, start_batch]`` (and with
    ``read_ahead``, of every later epoch, whole: see the module doc); in a worker process, a
    :class:`ShardkitError` ends the stream as a :class:`WorkerFailure`.

    ``builder``: the route's worker half (:class:`~shardkit.loader.route.Builder`). ``remainder``:
    ``(epoch, Remainder)`` after an elastic resume, that epoch runs on what the remainder leaves
    (set before the workers start: they hold a copy).

    ``layout``: ``(part, parts, workers)`` when this stream's workers are one part of a larger
    set (:mod:`~shardkit.loader.feeders`: ``parts`` processes share ``workers`` workers): its
    worker ``i`` is worker ``part + parts * i`` of ``workers``. None: its workers are all.
    """

    def __init__(self, config: PlanConfig, builder: Builder[W], control: torch.Tensor,
                 layout: tuple[int, int, int] | None = None, read_ahead: bool = False) -> None:
        self.config = config
        self.builder = builder
        self.control = control
        self.layout = layout
        self.read_ahead = read_ahead
        self.remainder: tuple[int, Remainder] | None = None

    def remainder_for(self, epoch: int, rest: Remainder | None) -> tuple[bool, tuple[int, Remainder] | None]:
        """Whether :attr:`remainder` must change (restarting the workers, which hold a copy) for
        ``epoch`` to run on ``rest`` (what an elastic resume left of it; None: all of it), and
        its new value. A remainder held for another epoch is left: it applies to that epoch only.

        Example:
            >>> s = BatchStream(None, None, None)  # type: ignore[arg-type]
            >>> s.remainder_for(0, None)
            (False, None)
        """
        if rest is not None:
            return self.remainder != (epoch, rest), (epoch, rest)
        return self.remainder is not None and self.remainder[0] == epoch, None

    def __iter__(self) -> Iterator[W | WorkerFailure | EpochPadding]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.layout is not None:
            part, parts, workers = self.layout
            worker = part + parts * worker
        epoch, start = int(self.control[0]), int(self.control[1])
        cfg = self.config
        while True:
            rest = self.remainder[1] if self.remainder is not None and self.remainder[0] == epoch else None
            count = cfg.epoch_batches(rest)
            mine = worker_batch_indices(count, num_workers=workers, worker_id=worker, start_batch=start)
            order = cfg.order(epoch)
            for j in mine:
                shards, indices, positions = cfg.batch(order, j, rest)
                seeds = sample_seeds(cfg.seed, epoch, positions)
                try:
                    batch = self.builder.build(shards.tolist(), indices.tolist(), seeds.tolist())
                except ShardkitError as err:
                    if info is None:  # in this process: the error keeps its own traceback
                        raise
                    yield WorkerFailure(type(err), err.message, err.where, traceback.format_exc())
                    return
                yield batch
            if not self.read_ahead or cfg.epoch_batches(None) == 0:
                return
            rounds = -(-(count - start) // workers)  # this epoch's rounds over the workers
            for _ in range(rounds - len(mine)):
                yield EpochPadding()
            epoch, start = epoch + 1, 0
