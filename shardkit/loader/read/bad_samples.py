"""The bad-sample policy every batch builder shares: raise, or replace deterministically.

``on_error="replace"`` gives a bad sample's slot the next good sample of the same batch
(cyclically). When no sample of the batch is good (always the case for a bad sample with
``batch_size=1``), the first bad slot takes the first good sample among the ``SEARCH`` samples
that follow it in its shard (cyclically), with the bad sample's seed; the other slots then copy
it. Both choices depend only on the batch and the shard's content, never on the worker count,
so every ``num_workers`` delivers the same batches. Only when that search finds nothing either
is :class:`LoaderError` raised, naming the keys.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from shardkit.errors import LoaderError
from shardkit.loader.read.reader import ShardReader

__all__ = ["SEARCH", "BadSample", "Filled", "fill_batch"]

T = TypeVar("T")

log = logging.getLogger("shardkit.loader")

_told: set[int] = set()  # the processes that have logged a replaced sample (a forked worker has not)


def _tell_first(err: BadSample, key: str, where: str) -> None:
    """Log the first sample this process replaces, with its shard and key (the rest are counted in
    ``loader.stats.replaced``): corruption is never silent."""
    if os.getpid() in _told:
        return
    _told.add(os.getpid())
    log.warning("shardkit: replaced a bad sample, key %s in %s (%s); on_error='replace' gives its slot another "
                "sample; further ones in this process are counted in loader.stats.replaced", key, where, err)

#: How many following samples of its shard stand in for a bad sample whose whole batch is bad.
SEARCH = 32


class BadSample(Exception):
    """One sample cannot be used (undecodable image, missing member); the message names it."""


@dataclass
class Filled(Generic[T]):
    """A batch's samples after the policy: ``keys[i]`` and ``results[i]`` for every slot;
    ``copies`` lists ``(dst, src)`` slots where ``dst`` took ``src``'s sample (builders writing
    into a shared buffer copy those rows); ``replaced`` counts the bad samples."""

    keys: list[str]
    results: list[T]
    replaced: int
    copies: list[tuple[int, int]]

    def source(self, slot: int) -> int:
        """The slot whose sample ``slot`` holds: its own, or the one it took a copy of (a copy is
        always of a good slot, so one step)."""
        return next((src for dst, src in self.copies if dst == slot), slot)


def fill_batch(attempt: Callable[[int, int, int, int], T], reader: ShardReader, shards: Sequence[int],
               indices: Sequence[int], seeds: Sequence[int], *, on_error: str) -> Filled[T]:
    """Run ``attempt(slot, shard, index, seed)`` for each sample of a batch, then apply ``on_error``.

    ``attempt`` raises :class:`BadSample` for a sample it cannot use; other errors propagate.

    Raises:
        LoaderError: a bad sample with ``on_error="raise"``; or no good sample in the batch
            nor among the ``SEARCH`` samples after its first bad one (names their keys).
    """
    n = len(shards)
    keys = [reader.key(int(shards[i]), int(indices[i])) for i in range(n)]  # known before decoding
    results: list[T | None] = [None] * n
    bad: list[int] = []
    for i in range(n):
        try:
            results[i] = attempt(i, int(shards[i]), int(indices[i]), int(seeds[i]))
        except BadSample as err:
            if on_error == "raise":
                raise LoaderError(f"bad sample ({err}); use on_error='replace' to skip such samples") from None
            _tell_first(err, keys[i], reader.where(int(shards[i])))
            bad.append(i)
    copies: list[tuple[int, int]] = []
    if bad:
        bad_set = set(bad)
        if len(bad_set) == n:
            first = bad[0]
            keys[first], results[first] = _search(attempt, reader, first, int(shards[first]), int(indices[first]),
                                                  int(seeds[first]), keys)
            bad_set.discard(first)
        for i in sorted(bad_set):
            j = next((i + k) % n for k in range(1, n) if (i + k) % n not in bad_set)
            keys[i], results[i] = keys[j], results[j]
            copies.append((i, j))
    return Filled(keys, results, len(bad), copies)  # type: ignore[arg-type]  # every slot is filled


def _search(attempt: Callable[[int, int, int, int], T], reader: ShardReader, slot: int, shard: int,
            index: int, seed: int, keys: list[str]) -> tuple[str, T]:
    size = int(reader.shards.num_samples[shard])
    tried = 0
    for k in range(1, min(SEARCH, size - 1) + 1):
        other = (index + k) % size
        tried += 1
        try:
            return reader.key(shard, other), attempt(slot, shard, other, seed)
        except BadSample:
            continue
    where = reader.where(shard)
    raise LoaderError(f"every sample of a batch is corrupt ({', '.join(keys)}), and so are the {tried} samples "
                      f"after {keys[slot]} in its shard", where=where)
