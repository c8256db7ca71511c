"""Streaming packed shards into PyTorch: epoch plan, shard reading, decode, batching, prefetch."""
