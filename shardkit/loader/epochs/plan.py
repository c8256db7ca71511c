"""The epoch plan: which global sample ids each rank reads, and in which order.

A sample's global id is its shard's offset in the manifest plus its index inside the shard.
Every function here is pure (numpy only, no torch, no global RNG): the plan of an epoch depends
only on ``(seed, epoch, shard sizes, world size, batch size, drop_last, even_batches)``, never on
timing, the number of workers or the OS, so resuming is "skip the first k batches".

Nothing here grows with the number of samples: an epoch's order (:class:`EpochOrder`) holds arrays
of the number of shards and finds any position by arithmetic over shard sizes, each rank looks up
only the batches it reads, one at a time. A 5e9-sample dataset in 5e5 shards plans in tens of MB.

Two ways to share an epoch out over ranks: ``even_batches=True`` (the default, for training)
gives every rank the same number of full batches, padding with repeats (or dropping the tail);
``even_batches=False`` (for evaluation) cuts the epoch into batches of ``B``, the last one short,
and gives each rank a contiguous run of them, ranks differing by at most one batch, so every
sample is delivered exactly once over all ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shardkit.errors import LoaderError
from shardkit.loader.epochs.seeds import check_seed

_ORDER_STREAM = 0x6F72_6465  # tags the shard order's SeedSequence so other streams never coincide
_WINDOW_STREAM = 0x7769_6E64  # tags each window's SeedSequence

#: The version of the epoch plan: the same (seed, epoch, shards, layout) give the same batches
#: within a version. Version 2 seeds each window's shuffle on its own (version 1 drew them in turn).
PLAN_VERSION = 2


def shard_offsets(shard_sizes: Sequence[int] | npt.ArrayLike) -> np.ndarray:
    """Cumulative start of each shard: int64 array of length ``S + 1``, last entry = N.

    Raises LoaderError if a size is negative or not an integer. Empty shards are allowed.

    >>> shard_offsets([3, 0, 2]).tolist()
    [0, 3, 3, 5]
    """
    sizes = np.asarray(shard_sizes)
    if sizes.ndim != 1 or (sizes.size and sizes.dtype.kind not in "iu"):
        raise LoaderError(f"shard sizes must be a 1-D sequence of ints, got dtype {sizes.dtype}")
    if sizes.size and sizes.min() < 0:
        raise LoaderError(f"shard sizes must be >= 0, got {int(sizes.min())}")
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def locate(ids: npt.ArrayLike, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map global sample ids to ``(shard index, index within shard)``, both int64 arrays.

    ``offsets`` comes from :func:`shard_offsets`. Raises LoaderError for ids outside [0, N).
    Ragged batches (a 1-D object array of int arrays, what :func:`rank_batches` returns with
    ``even_batches=False``) map row by row to two object arrays of the same shape.

    >>> [a.tolist() for a in locate([0, 3, 4], shard_offsets([3, 0, 2]))]
    [[0, 2, 2], [0, 0, 1]]
    """
    if isinstance(ids, np.ndarray) and ids.dtype == object:
        rows = [locate(row, offsets) for row in ids]
        return _objects([shard for shard, _ in rows]), _objects([index for _, index in rows])
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= offsets[-1]):
        raise LoaderError(f"sample ids must be in [0, {int(offsets[-1])})")
    shard = np.searchsorted(offsets, ids, side="right") - 1  # "right" skips empty shards
    return shard, ids - offsets[shard]


def _objects(rows: Sequence[np.ndarray]) -> np.ndarray:
    """A 1-D object array holding ``rows`` as they are (numpy would stack equal-length rows)."""
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out


class Order(Protocol):
    """What the batch stream needs of an epoch's order: :class:`EpochOrder`, or
    :class:`~shardkit.loader.epochs.mix.MixedOrder` for several datasets."""

    num_samples: int

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard index, index within shard)`` of the samples at epoch ``positions``."""
        ...


class EpochOrder:
    """One epoch's delivery order, computed lazily: memory and start-up grow with the number of
    shards, never with the number of samples.

    Position ``p`` of the epoch (``0 <= p < N``) holds one sample. ``shuffle=False``: manifest
    order, sample ``p``. ``shuffle=True``: the shards are permuted (one draw from the
    ``(seed, epoch)`` stream), then each run of ``window`` consecutive shards in that order (a
    *window*) has its samples permuted among themselves by a generator seeded from
    ``(seed, epoch, window number)`` alone, so a reader never needs more than ``window`` shards
    open at once and any position is found without drawing the windows before it.

    Holds four int64 arrays of the number of shards, plus the permutations of the (at most two)
    windows last asked for: 4 bytes per sample of a window each (8 past 2**31 samples). This is plan version
    :data:`PLAN_VERSION`; version 1 drew the windows' shuffles one after another from one stream.

    >>> order = EpochOrder([3, 0, 2], seed=0, epoch=0, shuffle=False)
    >>> [a.tolist() for a in order.locate(np.array([0, 3, 4]))]
    [[0, 2, 2], [0, 0, 1]]
    """

    def __init__(self, shard_sizes: Sequence[int] | npt.ArrayLike, *, seed: int, epoch: int, shuffle: bool,
                 window: int = 8) -> None:
        check_seed(seed, epoch)
        if window < 1:
            raise LoaderError(f"window must be >= 1, got {window}")
        self._offsets = shard_offsets(shard_sizes)
        self.num_samples = int(self._offsets[-1])
        self._seed, self._epoch, self._shuffle = seed, epoch, shuffle
        self._windows: dict[int, np.ndarray] = {}
        if not shuffle:
            return
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, _ORDER_STREAM])))
        self._perm = rng.permutation(self._offsets.size - 1)  # slot t of the epoch reads shard _perm[t]
        sizes = np.diff(self._offsets)[self._perm]
        self._slot_ends = np.cumsum(sizes)
        self._slot_starts = self._slot_ends - sizes
        last = np.minimum(np.arange(window, sizes.size + window, window), sizes.size) - 1
        self._window_ends = self._slot_ends[last]
        self._window_starts = np.concatenate([[0], self._window_ends])[:-1]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard index, index within shard)`` of the samples at epoch ``positions`` (int64
        arrays of its shape). Raises LoaderError for positions outside ``[0, N)``."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.num_samples):
            raise LoaderError(f"epoch positions must be in [0, {self.num_samples})")
        if not self._shuffle:
            return locate(positions, self._offsets)
        windows = np.searchsorted(self._window_ends, positions, side="right")  # "right" skips empty ones
        unshuffled = np.empty_like(positions)
        for k in np.unique(windows).tolist():
            mine = windows == k
            start = self._window_starts[k]  # an int64: the sum stays int64
            unshuffled[mine] = start + self._window(k)[positions[mine] - start]
        slots = np.searchsorted(self._slot_ends, unshuffled, side="right")
        return self._perm[slots], unshuffled - self._slot_starts[slots]

    def ids(self, positions: np.ndarray) -> np.ndarray:
        """Global sample ids (shard offset + index within shard) at epoch ``positions``."""
        shard, index = self.locate(positions)
        return self._offsets[shard] + index

    def _window(self, k: int) -> np.ndarray:
        """The permutation of window ``k``'s samples; the last two asked for stay cached."""
        if (perm := self._windows.get(k)) is None:
            size = int(self._window_ends[k] - self._window_starts[k])
            seeds = np.random.SeedSequence([self._seed, self._epoch, _WINDOW_STREAM, k])
            perm = np.random.Generator(np.random.PCG64(seeds)).permutation(size)
            if size <= np.iinfo(np.int32).max:
                perm = perm.astype(np.int32)  # half the memory of what is kept
            if len(self._windows) >= 2:
                del self._windows[next(iter(self._windows))]
            self._windows[k] = perm
        return perm


def epoch_order(
    shard_sizes: Sequence[int] | npt.ArrayLike,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int = 8,
) -> np.ndarray:
    """The global sample ids of one whole epoch, in delivery order (int64 permutation of 0..N-1).

    :class:`EpochOrder` materialised: what it delivers position by position, for tests and small
    datasets (the loader never builds this array). Raises LoaderError for bad sizes, seed, epoch
    or window.

    >>> epoch_order([2, 3], seed=0, epoch=0, shuffle=False).tolist()
    [0, 1, 2, 3, 4]
    >>> sorted(epoch_order([2, 3], seed=0, epoch=0, shuffle=True).tolist())
    [0, 1, 2, 3, 4]
    """
    order = EpochOrder(shard_sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    return order.ids(np.arange(order.num_samples, dtype=np.int64))


def num_batches(
    num_samples: int,
    *,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    even_batches: bool = True,
    rank: int | None = None,
) -> int:
    """Batches rank ``rank`` yields per epoch.

    ``even_batches=True``: the same on every rank, ``N // (W*B)`` if ``drop_last`` else
    ``ceil(N / (W*B))`` (``rank`` is only checked). ``even_batches=False``: the epoch's ``T``
    batches (``T = N // B`` if ``drop_last`` else ``ceil(N / B)``) shared out, the first
    ``W - T % W`` ranks taking ``T // W`` and the others one more; ``rank=None`` gives the most
    any rank takes, ``ceil(T / W)``: the steps of an epoch when ranks go in lock step.
    Raises LoaderError for a negative ``num_samples`` or bad world size, batch size or rank.

    >>> num_batches(10, world_size=2, batch_size=3, drop_last=True), num_batches(
    ...     10, world_size=2, batch_size=3, drop_last=False)
    (1, 2)
    >>> [num_batches(10, world_size=3, batch_size=3, drop_last=False, even_batches=False, rank=r)
    ...  for r in (0, 1, 2, None)]
    [1, 1, 2, 2]
    """
    if num_samples < 0:
        raise LoaderError(f"num_samples must be >= 0, got {num_samples}")
    if world_size < 1:
        raise LoaderError(f"world_size must be >= 1, got {world_size}")
    if batch_size < 1:
        raise LoaderError(f"batch_size must be >= 1, got {batch_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise LoaderError(f"rank must be in [0, {world_size}), got {rank}")
    if not even_batches:
        if rank is None:
            return -(-_total_batches(num_samples, batch_size, drop_last) // world_size)
        return _uneven_span(num_samples, rank=rank, world_size=world_size, batch_size=batch_size,
                            drop_last=drop_last)[1]
    per_step = world_size * batch_size
    return num_samples // per_step if drop_last else -(-num_samples // per_step)


def _total_batches(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of ``batch_size`` in an epoch of ``num_samples``, the last one short unless dropped."""
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def _uneven_span(
    num_samples: int, *, rank: int, world_size: int, batch_size: int, drop_last: bool
) -> tuple[int, int]:
    """``(first batch, number of batches)`` of ``rank`` in the epoch's batches, ``even_batches=False``.

    The later ranks take the extra batches.
    """
    total = _total_batches(num_samples, batch_size, drop_last)
    base, extra = divmod(total, world_size)
    fewer = world_size - extra  # ranks [0, fewer) take `base` batches, the others base + 1
    return rank * base + max(0, rank - fewer), base + (rank >= fewer)


def stream_positions(
    num_samples: int,
    *,
    rank: int,
    batch_index: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    even_batches: bool = True,
) -> np.ndarray:
    """Where batch ``batch_index`` of ``rank`` sits in the epoch stream: int64 positions, in order.

    The layout is :func:`rank_batches`'s: row ``batch_index`` of it is ``order[positions % N]``.
    With ``even_batches=True`` and ``drop_last=False`` positions past ``N`` are the padding (they
    repeat the epoch from its start); with ``even_batches=False`` the epoch's last batch is short.
    Raises LoaderError for a batch index outside this rank's batches (or bad layout arguments).

    >>> stream_positions(5, rank=1, batch_index=0, world_size=2, batch_size=2, drop_last=False).tolist()
    [4, 5]
    """
    nb = num_batches(num_samples, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
                     even_batches=even_batches, rank=rank)
    if not 0 <= batch_index < nb:
        raise LoaderError(f"batch index must be in [0, {nb}), got {batch_index}")
    if even_batches:
        start = (rank * nb + batch_index) * batch_size
        return np.arange(start, start + batch_size, dtype=np.int64)
    first, _ = _uneven_span(num_samples, rank=rank, world_size=world_size, batch_size=batch_size,
                            drop_last=drop_last)
    start = (first + batch_index) * batch_size
    return np.arange(start, min(start + batch_size, num_samples), dtype=np.int64)


def rank_batches(
    order: np.ndarray,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    even_batches: bool = True,
) -> np.ndarray:
    """This rank's batches of global sample ids.

    ``even_batches=True``: a new int64 array ``[num_batches, batch_size]``. The epoch stream is
    ``order`` cut to ``nb*W*B`` ids (``drop_last=True``: every sample at most once, fewer than
    ``W*B`` dropped) or padded to it by repeating ``order`` cyclically from its start
    (``drop_last=False``: every sample at least once, fewer than ``W*B`` repeats). Rank ``r``
    takes the contiguous slice ``[r*nb*B, (r+1)*nb*B)`` of that stream, so it reads few shards;
    all batches are full and every rank gets the same ``nb``.

    ``even_batches=False``: a 1-D object array of ``num_batches(..., rank=rank)`` int64 arrays.
    ``order`` is cut into batches of ``B`` (``drop_last=False``: the last one short, every sample
    exactly once; ``drop_last=True``: the short one dropped, fewer than ``B`` samples left out)
    and rank ``r`` takes a contiguous run of them; ranks differ by at most one batch, and a rank
    may get none when there are fewer batches than ranks.

    Raises LoaderError for an empty order or bad rank, world size or batch size.

    >>> rank_batches(np.arange(5), rank=1, world_size=2, batch_size=2, drop_last=False).tolist()
    [[4, 0], [1, 2]]
    >>> [b.tolist() for b in rank_batches(np.arange(5), rank=1, world_size=2, batch_size=2,
    ...                                   drop_last=False, even_batches=False)]
    [[2, 3], [4]]
    """
    order = np.asarray(order)
    if order.ndim != 1 or order.size == 0 or order.dtype.kind not in "iu":
        raise LoaderError(
            f"order must be a non-empty 1-D int array, got {order.dtype}{order.shape}"
        )
    nb = num_batches(
        order.size,
        world_size=world_size,
        batch_size=batch_size,
        drop_last=drop_last,
        even_batches=even_batches,
        rank=rank,
    )
    order = order.astype(np.int64, copy=False)
    if not even_batches:
        first, _ = _uneven_span(
            order.size, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=drop_last
        )
        starts = range(first * batch_size, (first + nb) * batch_size, batch_size)
        return _objects([order[i : i + batch_size].copy() for i in starts])
    per_rank = nb * batch_size
    stream = np.arange(rank * per_rank, (rank + 1) * per_rank, dtype=np.int64) % order.size
    return order[stream].reshape(nb, batch_size)


def worker_batch_indices(
    num_batches: int, *, num_workers: int, worker_id: int, start_batch: int = 0
) -> range:
    """The batch indices worker ``worker_id`` produces, in order, resuming at ``start_batch``.

    Worker ``w`` of ``W`` takes batch ``j >= start_batch`` when ``(j - start_batch) % W == w``, so
    worker 0 always yields the next batch due: a round-robin merge of the workers (what torch's
    DataLoader does) gives ``start_batch, start_batch + 1, ...``. ``num_workers=0``: the main
    process (``worker_id=0``) does all. Raises LoaderError for out-of-range arguments.

    >>> list(worker_batch_indices(7, num_workers=2, worker_id=1, start_batch=2))
    [3, 5]
    """
    if num_workers < 0:
        raise LoaderError(f"num_workers must be >= 0, got {num_workers}")
    if not 0 <= worker_id < max(num_workers, 1):
        raise LoaderError(f"worker_id must be in [0, {max(num_workers, 1)}), got {worker_id}")
    if not 0 <= start_batch <= num_batches:
        raise LoaderError(f"start_batch must be in [0, {num_batches}], got {start_batch}")
    return range(start_batch + worker_id, num_batches, max(num_workers, 1))
