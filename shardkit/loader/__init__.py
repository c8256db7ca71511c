"""Streaming packed shards into PyTorch: epoch plan, shard reading, decode, batching, prefetch."""

from shardkit.loader.loader import ShardLoader
from shardkit.loader.stats import StageStats

__all__ = ["ShardLoader", "StageStats"]
