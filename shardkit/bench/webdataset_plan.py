"""How the bench's plain webdataset baseline splits and batches the shards it reads
(:class:`WebdatasetPlan`): whole shards per worker, as webdataset's ``split_by_worker`` gives
them, and batches made in the workers or, where a worker reads less than a batch, regrouped in
the ``WebLoader``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.bench.report import counted

__all__ = ["WebdatasetPlan", "webdataset_plan", "webdataset_workers"]


@dataclass(frozen=True)
class WebdatasetPlan:
    """How the plain webdataset baseline batches. Its workers split whole shards (worker ``i`` reads
    shards ``i``, ``i + workers``, …: webdataset's ``split_by_worker``) and batch what they read;
    ``shares``: the images each worker reads an epoch (one share without workers).

    Where every share holds a full batch, each worker batches its own images and drops its last
    partial batch (``batched(B, partial=False)``); otherwise a worker with less than a batch would
    deliver nothing, and the baseline rebatches (``rebatch``) as webdataset's documentation
    advises: the workers keep their partial batches and the ``WebLoader`` regroups the images into
    full batches (``.unbatched().batched(B, partial=False)``), as many an epoch as the other loaders.

    Example:
        >>> plan = webdataset_plan([30] * 10, workers=8, batch_size=256)
        >>> plan.workers, plan.shares[:3], plan.rebatch, plan.batches_per_epoch
        (8, (60, 60, 30), True, 1)
        >>> webdataset_plan([5, 5, 5, 5, 4], workers=2, batch_size=8).batches_per_epoch  # 14 and 10 images
        2
    """

    workers: int
    shares: tuple[int, ...]
    batch_size: int

    @property
    def rebatch(self) -> bool:
        return min(self.shares) < self.batch_size

    @property
    def batches_per_epoch(self) -> int:
        if self.rebatch:
            return sum(self.shares) // self.batch_size
        return sum(share // self.batch_size for share in self.shares)

    def described(self) -> str:
        """The images the workers read an epoch: ``14 and 10 images``, ``30 to 60 images each``."""
        low, high = min(self.shares), max(self.shares)
        if len(self.shares) == 2:
            return f"{self.shares[0]} and {counted(self.shares[1], 'image')}"
        return counted(high, "image") + " each" if low == high else f"{low} to {high} images each"


def webdataset_plan(shard_samples: Sequence[int], *, workers: int, batch_size: int) -> WebdatasetPlan:
    """The :class:`WebdatasetPlan` for shards of ``shard_samples`` images each (in index order),
    with ``workers`` asked for (:func:`webdataset_workers` lowers them to the shard count)."""
    count = webdataset_workers(workers, len(shard_samples))
    split = max(count, 1)
    shares = tuple(sum(shard_samples[i::split]) for i in range(split))
    return WebdatasetPlan(count, shares, batch_size)


def webdataset_workers(workers: int, shards: int) -> int:
    """The plain webdataset baseline's workers: ``workers``, but no more than ``shards``.

    Its workers split whole shards between them (``split_by_worker``), and a worker left without a
    shard fails the run ("No samples found in dataset"); ShardLoader splits samples, so it keeps
    every worker.

    Example:
        >>> webdataset_workers(8, 5), webdataset_workers(2, 5), webdataset_workers(0, 1)
        (5, 2, 0)
    """
    return min(workers, shards)
