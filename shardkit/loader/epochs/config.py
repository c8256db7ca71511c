"""What one rank's epoch plan depends on, and the plan's questions answered from it.

:class:`PlanConfig` is built once by the loader (and sent to each feeder process): the shard
sizes, seed, order options and the rank's layout. From it come an epoch's lazy order, a rank's
batch of it (shards, indices and seed positions), the batch counts and the resume state. No torch:
the plan is arithmetic on arrays the size of the shard list.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shardkit.errors import LoaderError
from shardkit.loader.epochs.mix import Mix, MixedOrder
from shardkit.loader.epochs.plan import EpochOrder, Order, num_batches, stream_positions
from shardkit.loader.epochs.remainder import Remainder
from shardkit.loader.epochs.state import LoaderState, check_compatible, check_dataset, shards_digest

__all__ = ["PlanConfig"]


@dataclass(frozen=True, eq=False)
class PlanConfig:
    """What the epoch plan of one rank depends on (besides the epoch).

    ``shard_sizes`` is held as a read-only int64 array (any int sequence is accepted): a plan's
    memory grows with the number of shards, never with the number of samples. ``mix``: several
    datasets (:class:`~shardkit.loader.epochs.mix.Mix`), whose joined shard sizes ``shard_sizes`` must be."""

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
    #: The datasets' :func:`~shardkit.loader.epochs.state.dataset_identity`, bound into every state (None:
    #: states carry none and only shard sizes are compared).
    dataset: str | None = None
    num_samples: int = field(init=False)

    def __post_init__(self) -> None:
        sizes = np.array(self.shard_sizes, dtype=np.int64, copy=True).reshape(-1)
        if self.mix is not None and not np.array_equal(sizes, self.mix.shard_sizes):
            raise LoaderError("shard_sizes must be the mix's joined shard sizes")
        sizes.flags.writeable = False
        object.__setattr__(self, "shard_sizes", sizes)
        object.__setattr__(self, "num_samples", int(sizes.sum()))

    @functools.cached_property
    def digest(self) -> str:
        """:func:`~shardkit.loader.epochs.state.shards_digest` of the shard sizes, made when a state is first
        taken or checked (0.3 s at 5e5 shards: not on the way to the first batch)."""
        return shards_digest(np.asarray(self.shard_sizes))

    @property
    def num_batches(self) -> int:
        """This rank's batches in a whole epoch."""
        return self.epoch_batches(None)

    @property
    def rank_samples(self) -> int:
        """This rank's samples in a whole epoch, the padding of ``even_batches`` included (what a
        ``DistributedSampler``'s ``len`` counts)."""
        batches = self.num_batches
        if batches == 0:
            return 0
        last = stream_positions(self.num_samples, rank=self.rank, batch_index=batches - 1,
                                world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
                                even_batches=self.even_batches)
        return (batches - 1) * self.batch_size + len(last)

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

        Seed positions (for :func:`~shardkit.loader.epochs.seeds.sample_seeds`) are the samples' places
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

    def real_samples(self, batch_index: int, remainder: Remainder | None = None) -> int:
        """How many of this rank's batch ``batch_index`` are the epoch's own samples; the rest of
        the batch (always its end) repeat the epoch's first samples as padding, which exists only
        with ``even_batches=True`` and ``drop_last=False`` over several ranks.

        An evaluation that gathers per batch keeps ``batch[:real]`` of each rank and so counts
        every sample once.

        Example:
            >>> c = PlanConfig([10], seed=0, shuffle=False, window=1, rank=1, world_size=2, batch_size=4,
            ...                drop_last=False)
            >>> [c.real_samples(b) for b in range(c.num_batches)]  # rank 1 reads positions 8..15 of 10
            [2, 0]
        """
        n = self.num_samples if remainder is None else len(remainder)
        stream = stream_positions(n, rank=self.rank, batch_index=batch_index, world_size=self.world_size,
                                  batch_size=self.batch_size, drop_last=self.drop_last,
                                  even_batches=self.even_batches)
        return int(np.count_nonzero(stream < n))

    def state(self, epoch: int, consumed: int, remainder: Remainder | None = None) -> LoaderState:
        """The resume state after ``consumed`` batches of ``epoch`` (of ``remainder`` if given)."""
        return LoaderState(
            seed=self.seed, epoch=epoch, batches_consumed=consumed, num_samples=self.num_samples,
            shards_digest=self.digest, world_size=self.world_size,
            batch_size=self.batch_size, drop_last=self.drop_last, shuffle=self.shuffle, window=self.window,
            even_batches=self.even_batches, remainder=None if remainder is None else remainder.to_list(),
            mix=None if self.mix is None else self.mix.record(), dataset=self.dataset,
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
        check_dataset(s, self.dataset)
        layout = (self.world_size, self.batch_size, self.drop_last, self.even_batches)
        if (s.world_size, s.batch_size, s.drop_last, s.even_batches) == layout:
            epoch, start = s.resume_at(self.rank)
            carried = Remainder(s.remainder) if s.remainder is not None and epoch == s.epoch else None
            return epoch, start, carried
        rest = s.rest
        return (s.epoch, 0, rest) if len(rest) else (s.epoch + 1, 0, None)
