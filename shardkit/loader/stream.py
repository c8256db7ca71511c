"""The batch stream one worker runs: this epoch's plan, this worker's batches, built in order.

A ``torch.utils.data.IterableDataset`` so torch's ``DataLoader`` can run it in persistent worker
processes. The epoch and resume point are read from a small shared-memory tensor at the start of
each iteration, which is how persistent workers learn about a new epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardkit.loader.batch import Batch, BatchBuilder
from shardkit.loader.plan import (
    batch_positions,
    epoch_order,
    locate,
    num_batches,
    rank_batches,
    sample_seeds,
    shard_offsets,
    worker_batch_indices,
)


@dataclass(frozen=True)
class PlanConfig:
    """What the epoch plan of one rank depends on (besides the epoch)."""

    shard_sizes: tuple[int, ...]
    seed: int
    shuffle: bool
    window: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool

    @property
    def num_samples(self) -> int:
        return sum(self.shard_sizes)

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_samples, world_size=self.world_size, batch_size=self.batch_size,
                           drop_last=self.drop_last)

    def batches(self, epoch: int) -> np.ndarray:
        """Global sample ids of this rank's batches in ``epoch``, shape ``[num_batches, B]``."""
        order = epoch_order(self.shard_sizes, seed=self.seed, epoch=epoch, shuffle=self.shuffle, window=self.window)
        return rank_batches(order, rank=self.rank, world_size=self.world_size, batch_size=self.batch_size,
                            drop_last=self.drop_last)


class BatchStream(IterableDataset[Batch]):
    """Yield this worker's batches of the epoch in ``control = [epoch, start_batch]``."""

    def __init__(self, config: PlanConfig, builder: BatchBuilder, control: torch.Tensor) -> None:
        self.config = config
        self.builder = builder
        self.control = control

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, start = int(self.control[0]), int(self.control[1])
        cfg = self.config
        batches = cfg.batches(epoch)
        shards, indices = locate(batches, shard_offsets(cfg.shard_sizes))
        for j in worker_batch_indices(len(batches), num_workers=workers, worker_id=worker, start_batch=start):
            positions = np.asarray(batch_positions(cfg.rank, j, num_batches=len(batches), batch_size=cfg.batch_size))
            seeds = sample_seeds(cfg.seed, epoch, positions)
            yield self.builder.build(shards[j], indices[j], seeds.tolist())
