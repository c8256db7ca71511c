"""Memory stays flat over epochs (generous bound here; the measured figure is in docs/performance.md)."""

from __future__ import annotations

from pathlib import Path

from shardkit import ShardLoader, transforms


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_rss_is_flat_over_epochs(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=8, transform=transforms.imagenet_train(64))
    for _ in loader:  # warm-up epoch: imports, allocator pools
        pass
    before = _rss_bytes()
    for _ in range(6):
        for _ in loader:
            pass
    growth = _rss_bytes() - before
    assert growth < 0.10 * before, f"RSS grew by {growth / 2**20:.1f} MiB over 6 epochs"
