"""The route contract every route shares: what ``deliver`` counts, and which routes want their
worker batches in pinned memory. (Each route's batches are tested in its own files.)"""

from __future__ import annotations

from pathlib import Path

import torch

from shardkit import ShardLoader, transforms
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.cpu import CpuRoute


def test_deliver_counts_every_batch_and_its_time(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=8, transform=transforms.imagenet_val(32), num_workers=2)
    n = sum(1 for _ in loader)
    s = loader.stats
    assert n == len(loader) and s.batches == n and s.samples == 69  # one rank: every sample once, the last batch short
    assert s.decode_s > 0 and s.read_s > 0  # the workers' counters arrive with their batches
    assert s.elapsed_s > 0 and s.wait_s >= 0 and s.copy_s >= 0
    assert s.elapsed_s >= s.wait_s + s.copy_s  # elapsed includes both, and the consumer's time
    loader.close()


def test_routes_ask_for_pinned_batches_only_when_they_copy_to_cuda(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=8, transform=transforms.imagenet_val(32), num_workers=1)
    assert isinstance(loader.route, CpuRoute) and loader.route.pin_memory is False
    assert loader._supply.dataloader is not None and loader._supply.dataloader.pin_memory is False
    reader = ShardReader(loader.reader.store, loader.manifest.shards)
    to_cuda = CpuRoute(reader, transforms.imagenet_val(32), device=torch.device("cuda"), on_error="replace",
                       batch_size=8, num_workers=1, prefetch=2)
    assert to_cuda.pin_memory is True  # CPU-decoded batches reach CUDA through DataLoader's pin thread
    loader.close()
    reader.close()
