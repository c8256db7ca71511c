"""Mixing datasets: each dataset's quota of an epoch, and the shard slices that fill it.

A mix of ``D`` datasets of ``N_0 .. N_{D-1}`` samples has epochs of ``L = N_0 + ... + N_{D-1}``
samples (as if concatenated), of which dataset ``i`` supplies ``q_i``: ``L * w_i / sum(w)``
rounded by largest remainder (exact rational arithmetic on the weights; ties to the earlier
dataset), so the quotas sum to ``L`` exactly. Without weights ``q_i = N_i``: plain concatenation.

Dataset ``i``'s share of epoch ``e``: write ``q_i = m * N_i + r`` (``0 <= r < N_i``). It holds
``m`` whole passes over the dataset (every sample ``m`` times) plus ``r`` samples that take turns:
epochs are grouped into *rounds* of ``k = ceil(N_i / r)``; round ``e // k`` orders the dataset's
shards by one permutation (seeded by ``(seed, i, round)``; manifest order without shuffle), and
epoch ``e`` takes the ``r`` samples at positions ``[u*r, (u+1)*r)`` of that order, ``u = e % k``,
wrapping to the start in the round's last epoch. So an under-weighted dataset (``q_i < N_i``)
never repeats a sample within an epoch and shows every sample in each round of ``k`` epochs
(``k*r - N_i`` of them twice, in different epochs); an over-weighted one repeats by design.

The epoch's pieces are *slices* ``(shard, start, count)``: whole shards, and at most two partial
shards per dataset at the ends of its turn, at most ``m + 1`` slices per shard. They take the place
of shards in :class:`~shardkit.loader.epochs.plan.EpochOrder` (slices permuted, windows of them shuffled),
so ranks, workers, ``drop_last``, ``even_batches``, exact and elastic resume work unchanged on an
epoch of ``L`` positions. Finding an epoch's slices is arithmetic over each dataset's shard sizes:
no array here grows with the number of samples.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

import numpy as np
import numpy.typing as npt

from shardkit.errors import LoaderError
from shardkit.loader.epochs.plan import EpochOrder, shard_offsets
from shardkit.loader.epochs.seeds import check_seed

__all__ = ["Mix", "MixedOrder", "check_weights", "epoch_quotas"]

_MAX_WEIGHT = 1 << 64
_TURN_STREAM = 0x6D69_7874  # tags each round's shard permutation of a dataset ("mixt")


def check_weights(weights: Iterable[object], count: int, names: Sequence[str]) -> list[Fraction]:
    """The weights as exact fractions (``names[i]`` names dataset ``i`` in errors).

    Raises:
        LoaderError: not a sequence of ``count`` numbers, or a weight that is not positive and finite.
    """
    if isinstance(weights, (str, bytes, Mapping)) or not isinstance(weights, Iterable):
        raise LoaderError(f"weights must be a sequence of numbers, one per dataset, got {weights!r}")
    weights = list(weights)
    if len(weights) != count:
        raise LoaderError(f"weights has {len(weights)} entries for {count} datasets; give one per dataset")
    out = []
    for name, w in zip(names, weights, strict=True):
        item = getattr(w, "item", None)
        if getattr(w, "ndim", None) == 0 and callable(item):
            w = item()  # an element of a tensor or array of weights (torch.tensor([0.7, 0.3]))
        weight = _weight(w)
        if weight is None:
            shown = f"an integer of {int(w).bit_length()} bits" if isinstance(w, Integral) and abs(int(w)) >> 64 else w
            raise LoaderError(f"the weight of dataset {name} must be a positive finite number, got {shown!r:.80}")
        if weight >= _MAX_WEIGHT:
            raise LoaderError(f"the weight of dataset {name} must be below 2**64, got a number of "
                              f"{int(weight).bit_length()} bits (only the ratios of the weights count)")
        out.append(weight)
    return out


def _weight(w: object) -> Fraction | None:
    """``w`` as an exact fraction, or None unless it is a positive finite number.

    An integer is taken exactly (``float(10**400)`` would overflow); the caller bounds it below
    2**64, which keeps the quota arithmetic small and refuses no useful mix (a ratio of 2**64 to
    1 rounds the other datasets' quotas to nothing anyway).
    """
    if isinstance(w, bool) or not isinstance(w, Real):
        return None
    if isinstance(w, Integral):
        value = Fraction(int(w))
    else:
        try:
            f = float(w)
        except (OverflowError, ValueError):
            return None
        if not math.isfinite(f):
            return None
        value = Fraction(f)
    return value if value > 0 else None


def epoch_quotas(num_samples: Sequence[int], weights: Iterable[object] | None = None, *,
                 names: Sequence[str] | None = None) -> list[int]:
    """Samples each dataset supplies to an epoch of ``L = sum(num_samples)``.

    ``weights=None``: ``num_samples`` itself. Otherwise ``L * w_i / sum(w)`` rounded by largest
    remainder (exact fractions; equal remainders go to the earlier dataset), summing to ``L``.

    Raises:
        LoaderError: a dataset with no samples, a weight that is not a positive finite number,
            a weight count other than the dataset count, or a quota that rounds to 0 (naming
            the dataset by ``names[i]``, default its index).

    >>> epoch_quotas([100, 50], [0.5, 0.5]), epoch_quotas([10, 10, 10], [1, 1, 1]), epoch_quotas([3, 4])
    ([75, 75], [10, 10, 10], [3, 4])
    >>> epoch_quotas([5, 5], [2, 1])  # 20/3 and 10/3: the larger remainder (2/3) takes the spare sample
    [7, 3]
    """
    labels = [str(i) for i in range(len(num_samples))] if names is None else list(names)
    for name, n in zip(labels, num_samples, strict=True):
        if n < 1:
            raise LoaderError(f"dataset {name} has no samples; a mix needs samples in every dataset")
    total = sum(num_samples)
    if weights is None:
        return [int(n) for n in num_samples]
    fractions = check_weights(weights, len(num_samples), labels)
    exact = [total * w / sum(fractions) for w in fractions]
    quotas = [math.floor(x) for x in exact]
    spare = total - sum(quotas)
    for i in sorted(range(len(exact)), key=lambda i: (quotas[i] - exact[i], i))[:spare]:
        quotas[i] += 1
    for name, w, q in zip(labels, fractions, quotas, strict=True):
        if q == 0:
            raise LoaderError(f"dataset {name}'s weight {float(w):g} gives it 0 of an epoch's {total} samples; "
                              "raise its weight or leave the dataset out")
    return quotas


class Mix:
    """Several datasets in one shard index space (dataset by dataset) with epoch quotas.

    ``shard_sizes[i]``: dataset ``i``'s shard sizes; ``weights``: see :func:`epoch_quotas`.
    :meth:`slices` gives an epoch's pieces, :meth:`record` what a loader state keeps of the mix.

    Raises:
        LoaderError: fewer than two datasets, bad shard sizes, or bad weights (see :func:`epoch_quotas`).

    >>> mix = Mix([[3, 2], [4]], weights=[1, 2])  # shards 0, 1 of dataset 0 and shard 2 of dataset 1
    >>> mix.num_samples, mix.quotas
    (9, [3, 6])
    >>> [a.tolist() for a in mix.slices(seed=0, epoch=1, shuffle=False)]  # (shard, start, count)
    [[1, 0, 2, 2], [0, 0, 0, 2], [2, 1, 4, 2]]
    """

    def __init__(self, shard_sizes: Sequence[Sequence[int] | npt.ArrayLike], weights: Iterable[object] | None = None,
                 *, names: Sequence[str] | None = None) -> None:
        if len(shard_sizes) < 2:
            raise LoaderError(f"a mix needs at least two datasets, got {len(shard_sizes)}")
        offsets = [shard_offsets(s) for s in shard_sizes]
        self.sizes = tuple(np.diff(o) for o in offsets)
        #: Samples of each dataset.
        self.dataset_samples = [int(o[-1]) for o in offsets]
        #: Samples each dataset supplies to every epoch (they sum to :attr:`num_samples`).
        self.quotas = epoch_quotas(self.dataset_samples, weights, names=names)
        #: Samples in an epoch: the datasets' total.
        self.num_samples = sum(self.dataset_samples)
        #: The first shard of each dataset in the joined shard index (and the total at the end).
        self.first_shard = np.concatenate([[0], np.cumsum([s.size for s in self.sizes])]).astype(np.int64)
        #: Every dataset's shard sizes, one after another (the joined index's shard sizes).
        self.shard_sizes = np.concatenate(self.sizes).astype(np.int64)
        # digested once: a state is taken at every checkpoint and checked at every resume
        self._record = [{"num_samples": n, "quota": q, "shards_digest": _digest(s)}
                        for n, q, s in zip(self.dataset_samples, self.quotas, self.sizes, strict=True)]

    def slices(self, *, seed: int, epoch: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s pieces as int64 arrays ``(shard, start, count)``: ``count``
        samples of the joined index's ``shard``, from its index ``start`` on. Dataset by
        dataset: its whole passes (shards in manifest order), then its turn (see the module).
        Sizes of 0 are kept in whole passes (as the shards are), dropped from turns."""
        check_seed(seed, epoch)
        pieces = []
        for i, (sizes, quota) in enumerate(zip(self.sizes, self.quotas, strict=True)):
            shard, start, count = _dataset_slices(sizes, quota, seed=seed, dataset=i, epoch=epoch, shuffle=shuffle)
            pieces.append((shard + self.first_shard[i], start, count))
        shard, start, count = (np.concatenate(column) for column in zip(*pieces, strict=True))
        return shard, start, count

    def record(self) -> list[dict[str, Any]]:
        """What a loader state keeps of the mix (JSON-able): per dataset, its samples, quota and
        a digest of its shard sizes."""
        return [dict(r) for r in self._record]


def _digest(sizes: np.ndarray) -> str:
    """A dataset's shard sizes fingerprinted from their int64 bytes: the same role as
    :func:`~shardkit.loader.epochs.state.shards_digest`, without its text (a tenth of the time at 5e5 shards)."""
    return hashlib.sha256(np.ascontiguousarray(sizes, dtype="<i8").tobytes()).hexdigest()[:16]


def _dataset_slices(sizes: np.ndarray, quota: int, *, seed: int, dataset: int, epoch: int,
                    shuffle: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One dataset's ``(shard, start, count)`` in epoch ``epoch`` (local shard numbers)."""
    n = int(sizes.sum())
    passes, turn = divmod(quota, n)
    every = np.arange(sizes.size, dtype=np.int64)
    shard = [np.tile(every, passes)]
    start = [np.zeros(passes * sizes.size, dtype=np.int64)]
    count = [np.tile(sizes, passes)]
    if turn:
        per_round = -(-n // turn)
        round_, u = divmod(epoch, per_round)
        if shuffle:
            seeds = np.random.SeedSequence([seed, dataset, round_, _TURN_STREAM])
            order = np.random.Generator(np.random.PCG64(seeds)).permutation(sizes.size)
        else:
            order = every
        ends = np.cumsum(sizes[order])
        begins = ends - sizes[order]
        lo = u * turn
        for a, b in ((lo, min(lo + turn, n)), (0, lo + turn - n)):
            if a >= b:
                continue
            first, last = np.searchsorted(ends, [a, b - 1], side="right").tolist()  # "right" skips empty shards
            slots = np.arange(first, last + 1)
            low, high = np.maximum(a, begins[slots]), np.minimum(b, ends[slots])
            keep = high > low
            shard.append(order[slots][keep])
            start.append((low - begins[slots])[keep])
            count.append((high - low)[keep])
    return np.concatenate(shard), np.concatenate(start), np.concatenate(count)


class MixedOrder:
    """One epoch's delivery order over a :class:`Mix`: an :class:`~shardkit.loader.epochs.plan.EpochOrder`
    over the epoch's slices, mapped back to the joined index's shards.

    ``window`` counts slices (whole or partial shards). Holds arrays of the number of slices.

    >>> order = MixedOrder(Mix([[3, 2], [4]], weights=[1, 2]), seed=0, epoch=1, shuffle=False)
    >>> order.ids(np.arange(9)).tolist()  # dataset 0: ids 0-4, its turn; dataset 1: ids 5-8, 1.5 passes
    [3, 4, 0, 5, 6, 7, 8, 7, 8]
    """

    def __init__(self, mix: Mix, *, seed: int, epoch: int, shuffle: bool, window: int = 8) -> None:
        self._shards, self._starts, counts = mix.slices(seed=seed, epoch=epoch, shuffle=shuffle)
        self._order = EpochOrder(counts, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
        self._offsets = shard_offsets(mix.shard_sizes)
        self.num_samples = self._order.num_samples

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard of the joined index, index within shard)`` at epoch ``positions``.
        Raises LoaderError for positions outside ``[0, L)``."""
        piece, index = self._order.locate(positions)
        return self._shards[piece], self._starts[piece] + index

    def ids(self, positions: np.ndarray) -> np.ndarray:
        """Ids in the joined index (shard offset + index within shard) at epoch ``positions``."""
        shard, index = self.locate(positions)
        return self._offsets[shard] + index
