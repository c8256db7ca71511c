"""The rest of an epoch after an elastic resume: which of its positions are still to deliver.

A state taken after ``k`` steps on ``W`` ranks with batch size ``B`` resumes on ``W'`` ranks with
``B'`` (any worker count) by laying the positions not yet delivered out again: the epoch's
positions (see :class:`~shardkit.loader.epochs.plan.EpochOrder`) that no rank had reached form a
:class:`Remainder`, a few increasing runs ``[start, stop)``, and the new ranks cut it into batches
exactly as they would cut a whole epoch of ``len(remainder)`` samples (the same
:func:`~shardkit.loader.epochs.plan.stream_positions` layout, padding and ``drop_last`` rules). So, over
all new ranks, the rest of the epoch is the samples not yet delivered: with ``drop_last=True``
none twice, and none left out but the fewer than ``W*B`` the first layout drops at the epoch's end
and the fewer than ``W'*B'`` the new one drops; with ``drop_last=False`` each at least once.

Resuming again from a remainder repeats the same step on it, so a job may change its world size
any number of times within an epoch. A remainder has at most one run per rank of each layout it
went through (adjacent runs merge), so it stays a few numbers in the state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardkit.errors import LoaderError
from shardkit.loader.epochs.plan import _uneven_span, num_batches

__all__ = ["Remainder"]

#: Most runs a state's remainder may list (one per rank per elastic resume in an epoch).
MAX_RUNS = 1 << 20


class Remainder:
    """Increasing, disjoint runs ``[start, stop)`` of epoch positions still to deliver.

    ``len()`` is the number of positions; :meth:`positions` maps the remainder's own positions
    ``0 .. len-1`` (what a layout over ``len`` samples numbers) to epoch positions.

    >>> r = Remainder([(2, 4), (7, 9)])
    >>> len(r), r.positions(np.arange(4)).tolist()
    (4, [2, 3, 7, 8])
    """

    def __init__(self, runs: Sequence[Sequence[int]] | np.ndarray) -> None:
        arr = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
        self.starts, self.stops = arr[:, 0].copy(), arr[:, 1].copy()
        self._ends = np.cumsum(self.stops - self.starts)  # remainder position where each run ends

    @classmethod
    def whole(cls, num_samples: int) -> Remainder:
        """The whole epoch: one run ``[0, num_samples)``."""
        return cls([(0, num_samples)])

    def __len__(self) -> int:
        return int(self._ends[-1]) if self._ends.size else 0

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Remainder) and np.array_equal(self.starts, other.starts)
                and np.array_equal(self.stops, other.stops))

    def __repr__(self) -> str:
        return f"Remainder({self.to_list()!r})"

    def positions(self, at: np.ndarray) -> np.ndarray:
        """Epoch positions of remainder positions ``at`` (each in ``[0, len)``)."""
        at = np.asarray(at, dtype=np.int64)
        run = np.searchsorted(self._ends, at, side="right")
        return self.starts[run] + at - (self._ends[run] - (self.stops[run] - self.starts[run]))

    def after(self, steps: int, *, world_size: int, batch_size: int, drop_last: bool,
              even_batches: bool) -> Remainder:
        """What is left once every rank of that layout over this remainder took ``steps`` steps
        (a rank with fewer batches, ``even_batches=False``, took all of its own).

        Positions a layout never hands out (the ``drop_last`` tail) and the padding past the end
        (repeats, ``drop_last=False``) are not part of the rest.
        """
        n = len(self)
        pieces: list[tuple[int, int]] = []
        for rank in _ranks_with_batches(n, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
                                        even_batches=even_batches):
            nb = num_batches(n, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
                             even_batches=even_batches, rank=rank)
            first = rank * nb if even_batches else _uneven_span(
                n, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=drop_last)[0]
            start, stop = (first + min(steps, nb)) * batch_size, min((first + nb) * batch_size, n)
            if start < stop:
                pieces.extend(self._runs_of(start, stop))
        return Remainder(_merged(pieces))

    def _runs_of(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The epoch runs that remainder positions ``[start, stop)`` cover, in order."""
        first, last = np.searchsorted(self._ends, [start, stop - 1], side="right").tolist()
        out = []
        for run in range(first, last + 1):
            begin = int(self._ends[run]) - int(self.stops[run] - self.starts[run])  # remainder pos of run start
            lo, hi = max(start, begin), min(stop, int(self._ends[run]))
            out.append((int(self.starts[run]) + lo - begin, int(self.starts[run]) + hi - begin))
        return out

    def to_list(self) -> list[list[int]]:
        """JSON-able: ``[[start, stop], ...]``."""
        return [[int(a), int(b)] for a, b in zip(self.starts, self.stops, strict=True)]

    @classmethod
    def from_list(cls, runs: object, *, num_samples: int, where: str) -> Remainder:
        """Validate a state's ``remainder``: a non-empty list of ``[start, stop]`` int pairs,
        increasing and disjoint, within ``[0, num_samples)``. Raises LoaderError naming the flaw."""
        if not isinstance(runs, list) or not runs:
            raise LoaderError(f"remainder must be a non-empty list of [start, stop] pairs, got {runs!r}"[:200],
                              where=where)
        if len(runs) > MAX_RUNS:
            raise LoaderError(f"remainder lists {len(runs)} runs, more than {MAX_RUNS}", where=where)
        previous = 0
        for i, run in enumerate(runs):
            ok = (isinstance(run, list) and len(run) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) for x in run))
            if not ok or not previous <= run[0] < run[1] <= num_samples:
                raise LoaderError(f"remainder run {i} {run!r} is not an increasing [start, stop] pair of ints "
                                  f"after {previous} and within [0, {num_samples}]", where=where)
            previous = run[1]
        return cls(runs)


def _merged(pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent runs joined (the pieces come increasing and disjoint)."""
    out: list[tuple[int, int]] = []
    for start, stop in pieces:
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def _ranks_with_batches(n: int, *, world_size: int, batch_size: int, drop_last: bool, even_batches: bool) -> range:
    """The ranks of a layout over ``n`` positions that hold at least one batch (the others hold
    nothing to deliver): at most about ``n / batch_size`` of them, however large ``world_size`` is."""
    if even_batches:
        nb = num_batches(n, world_size=world_size, batch_size=batch_size, drop_last=drop_last)
        return range(min(world_size, -(-n // (nb * batch_size)))) if nb else range(0)
    total = n // batch_size if drop_last else -(-n // batch_size)
    return range(max(0, world_size - total), world_size)  # fewer batches than ranks: the last ones take one
