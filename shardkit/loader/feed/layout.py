"""How a loader's workers and batches are laid out over its feeder processes, and how many
feeders ``feeders="auto"`` runs (:mod:`shardkit.loader.feed.pool`).

**Layout.** ``P`` feeders share the loader's ``W`` workers: worker ``g`` runs in feeder
``g % P`` as its worker ``g // P`` (:attr:`~shardkit.loader.run.stream.BatchStream.layout`). Worker
``g`` builds batches ``start + i`` with ``i % W == g``
(:func:`~shardkit.loader.epochs.plan.worker_batch_indices`), each feeder's DataLoader merges its
workers round-robin, so feeder ``p`` yields its batches in increasing order, and the loader
takes batch ``start + i`` from feeder ``(i % W) % P``: exactly the batches, order, samples and
augmentation of the same loader without feeders, for any ``P``.
"""

from __future__ import annotations

__all__ = ["MAX_FEEDERS", "WORKERS_PER_FEEDER", "auto_feeders", "feeder_of", "feeder_workers", "part_batches"]

#: Workers per feeder that ``feeders="auto"`` aims at (measured: 3 feeders of 5 workers fed
#: ResNet-18 best of 1 to 3 on a 16-core H200 host).
WORKERS_PER_FEEDER = 5
MAX_FEEDERS = 4


def auto_feeders(num_workers: int) -> int:
    """Feeders for ``feeders="auto"`` on the GPU route: one per :data:`WORKERS_PER_FEEDER`
    workers, at least 1 and at most :data:`MAX_FEEDERS`; 0 without workers.

    Example:
        >>> [auto_feeders(w) for w in (0, 1, 8, 16, 32)]
        [0, 1, 1, 3, 4]
    """
    if num_workers == 0:
        return 0
    return max(1, min(MAX_FEEDERS, num_workers // WORKERS_PER_FEEDER))


def feeder_workers(part: int, parts: int, num_workers: int) -> int:
    """How many of ``num_workers`` workers feeder ``part`` of ``parts`` runs (those ``g`` with ``g % parts == part``).

    >>> [feeder_workers(p, 3, 16) for p in range(3)]
    [6, 5, 5]
    """
    return len(range(part, num_workers, parts))


def feeder_of(i: int, *, num_workers: int, parts: int) -> int:
    """The feeder that builds the ``i``-th batch from the epoch's resume point (see the module doc).

    >>> [feeder_of(i, num_workers=4, parts=2) for i in range(6)]
    [0, 1, 0, 1, 0, 1]
    """
    return (i % num_workers) % parts


def part_batches(batches: int, *, part: int, parts: int, num_workers: int) -> int:
    """How many of an epoch's ``batches`` (from its resume point) feeder ``part`` builds: those
    ``i`` with :func:`feeder_of` ``== part``.

    >>> [part_batches(7, part=p, parts=2, num_workers=4) for p in range(2)]
    [4, 3]
    """
    rounds, rest = divmod(batches, num_workers)
    return rounds * feeder_workers(part, parts, num_workers) + len(range(part, rest, parts))
