"""The on-disk format: names, byte-reproducible tar writing, safe tar reading, offsets files."""

from shardkit.format.offsets import dump_offsets, load_offsets
from shardkit.format.spec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_NAME,
    make_key,
    member_name,
    offsets_name,
    shard_name,
    split_member,
)
from shardkit.format.tarread import iter_members, iter_samples, parse_span
from shardkit.format.tarwrite import SampleSpan, ShardSummary, TarShardWriter

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "SampleSpan",
    "ShardSummary",
    "TarShardWriter",
    "dump_offsets",
    "iter_members",
    "iter_samples",
    "load_offsets",
    "make_key",
    "member_name",
    "offsets_name",
    "parse_span",
    "shard_name",
    "split_member",
]
