"""The ``index.json`` manifest: read, write, validate; and verification of shards against it."""

from shardkit.index.manifest import Manifest, ShardEntry
from shardkit.index.manifest_io import locate_dataset, read_manifest, write_manifest, write_table
from shardkit.index.shards import ShardTable
from shardkit.index.verify import VerifyReport, verify_dataset

__all__ = [
    "Manifest",
    "ShardEntry",
    "ShardTable",
    "VerifyReport",
    "locate_dataset",
    "read_manifest",
    "verify_dataset",
    "write_manifest",
    "write_table",
]
