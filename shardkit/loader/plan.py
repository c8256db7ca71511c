"""The epoch plan: which global sample ids each rank reads, and in which order.

A sample's global id is its shard's offset in the manifest plus its index inside the shard.
Every function here is pure (numpy only, no torch, no global RNG): the plan of an epoch depends
only on ``(seed, epoch, shard sizes, world size, batch size, drop_last, even_batches)``, never on
timing, the number of workers or the OS, so resuming is "skip the first k batches".

Two ways to share an epoch out over ranks: ``even_batches=True`` (the default, for training)
gives every rank the same number of full batches, padding with repeats (or dropping the tail);
``even_batches=False`` (for evaluation) cuts the epoch into batches of ``B``, the last one short,
and gives each rank a contiguous run of them, ranks differing by at most one batch, so every
sample is delivered exactly once over all ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardkit.errors import LoaderError

_MASK64 = (1 << 64) - 1
_ORDER_STREAM = 0x6F72_6465  # tags the order's SeedSequence so other streams never coincide


def _check_seed(seed: int, epoch: int) -> None:
    if not 0 <= seed <= _MASK64:
        raise LoaderError(f"seed must be in [0, 2**64), got {seed}")
    if not 0 <= epoch <= _MASK64:
        raise LoaderError(f"epoch must be in [0, 2**64), got {epoch}")


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


def epoch_order(
    shard_sizes: Sequence[int] | npt.ArrayLike,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int = 8,
) -> np.ndarray:
    """The global sample ids of one epoch, in delivery order (int64 permutation of 0..N-1).

    ``shuffle=False``: manifest order ``0..N-1``. ``shuffle=True``: the shards are permuted, then
    each run of ``window`` consecutive shards (in permuted order) has its samples permuted among
    themselves, so a reader never needs more than ``window`` shards open at once. The generator
    is seeded from ``(seed, epoch)`` only. Raises LoaderError for bad sizes, seed, epoch or window.

    >>> epoch_order([2, 3], seed=0, epoch=0, shuffle=False).tolist()
    [0, 1, 2, 3, 4]
    >>> sorted(epoch_order([2, 3], seed=0, epoch=0, shuffle=True).tolist())
    [0, 1, 2, 3, 4]
    """
    _check_seed(seed, epoch)
    if window < 1:
        raise LoaderError(f"window must be >= 1, got {window}")
    offsets = shard_offsets(shard_sizes)
    n = int(offsets[-1])
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, _ORDER_STREAM])))
    perm = rng.permutation(offsets.size - 1)
    sizes = np.diff(offsets)[perm]
    ends = np.cumsum(sizes)  # end position of each permuted shard in the epoch
    order = np.arange(n, dtype=np.int64) + np.repeat(offsets[:-1][perm] - (ends - sizes), sizes)
    start = 0
    for stop in [*ends[window - 1 :: window].tolist(), n]:
        rng.shuffle(order[start:stop])  # in place: slices are views
        start = stop
    return order


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

    The later ranks take the extra batches, so :func:`batch_positions` (which knows only this
    rank's batch count) still gives every sample of the epoch its own position.
    """
    total = _total_batches(num_samples, batch_size, drop_last)
    base, extra = divmod(total, world_size)
    fewer = world_size - extra  # ranks [0, fewer) take `base` batches, the others base + 1
    return rank * base + max(0, rank - fewer), base + (rank >= fewer)


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


def batch_positions(rank: int, batch_index: int, *, num_batches: int, batch_size: int) -> range:
    """Global positions (in the padded epoch stream) of batch ``batch_index`` of ``rank``.

    Pass them to :func:`sample_seed` / :func:`sample_seeds`; unique across ranks and workers.
    With ``even_batches=False`` (ranks' ``num_batches`` differ, the later ranks holding more) they
    stay unique but leave gaps; a short last batch uses the first of its ``batch_size`` positions.

    >>> list(batch_positions(1, 2, num_batches=3, batch_size=2))
    [10, 11]
    """
    start = (rank * num_batches + batch_index) * batch_size
    return range(start, start + batch_size)


def _mix64(z: int) -> int:
    """splitmix64's finaliser (Steele et al. 2014): a bijection on 64-bit ints that avalanches."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """64-bit seed of the augmentation RNG of the sample at global ``position`` of an epoch.

    ``position`` is the index in the padded epoch stream shared by all ranks (see
    :func:`batch_positions`), so it never depends on workers and padded repeats get their own
    seeds. Raises LoaderError for arguments outside [0, 2**64).

    >>> sample_seed(0, 0, 1) != sample_seed(0, 0, 2) != sample_seed(0, 1, 1)
    True
    """
    _check_seed(seed, epoch)
    if not 0 <= position <= _MASK64:
        raise LoaderError(f"position must be in [0, 2**64), got {position}")
    return _mix64(_mix64(_mix64(seed) ^ epoch) ^ position)


def sample_seeds(seed: int, epoch: int, positions: npt.ArrayLike) -> np.ndarray:
    """Vectorised :func:`sample_seed`: uint64 array, equal element-wise to the scalar version.

    >>> int(sample_seeds(3, 1, [7])[0]) == sample_seed(3, 1, 7)
    True
    """
    _check_seed(seed, epoch)
    pos = np.asarray(positions)
    if pos.size and (pos.dtype.kind not in "iu" or pos.min() < 0):
        raise LoaderError("positions must be non-negative integers")
    z = pos.astype(np.uint64).reshape(-1) ^ np.uint64(_mix64(_mix64(seed) ^ epoch))
    z = z + np.uint64(0x9E3779B97F4A7C15)  # uint64 arrays wrap modulo 2**64, as intended
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).reshape(pos.shape)
