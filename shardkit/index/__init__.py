"""The ``index.json`` manifest: read, write, validate; and verification of shards against it."""

from shardkit.index.manifest import (
    Manifest,
    ShardEntry,
    locate_dataset,
    read_manifest,
    write_manifest,
)

__all__ = ["Manifest", "ShardEntry", "locate_dataset", "read_manifest", "write_manifest"]
