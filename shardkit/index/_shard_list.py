"""``index.json``'s ``shards`` list validated into a :class:`~shardkit.index.shards.ShardTable`.

Whole-column checks first (:func:`shard_table`: no object per shard, 1e5 shards in about 0.1 s
on one core after the JSON parse); when one fails, entry by entry, to name the first bad one.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.index import _fields
from shardkit.index.shards import ShardEntry, ShardTable

#: A shard's ``sha256``: 64 lower-case hex digits. It names the shard's file in a node cache
#: (``<cache_dir>/<sha256>.tar``), so anything else (``"../../x"``, ``"/abs"``) is refused.
SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: The fewest bytes a shard holding ``n`` samples can have: each sample has at least one member,
#: whose tar header alone is one 512-byte block (an upper bound on ``num_samples`` per byte).
_MIN_SAMPLE_BYTES = 512


def shard_table(raw: list[Any], where: str) -> ShardTable:
    """The validated shards of ``raw``; raises ``ManifestError`` naming ``where`` and the first bad entry."""
    table = _shard_table_fast(raw)
    return table if table is not None else ShardTable.from_entries(_shard_entries(raw, where))


def hex_hashes(raw: bytes) -> list[str]:
    """Raw sha256s (32 bytes each) as lower-case hex strings."""
    text = raw.hex()
    return [text[i:i + 64] for i in range(0, len(text), 64)]


def _shard_entries(raw: list[Any], where: str) -> list[ShardEntry]:
    """Validate the ``shards`` array, raising ``ManifestError`` naming the first bad entry."""
    shards = []
    for i, s in enumerate(raw):
        s = _fields.obj(s, f"shards[{i}]", where)
        entry = ShardEntry(
            _fields.string(s.get("url"), f"shards[{i}].url", where),
            _fields.integer(s.get("num_samples"), f"shards[{i}].num_samples", where),
            _fields.integer(s.get("num_bytes"), f"shards[{i}].num_bytes", where),
            _fields.string(s.get("sha256"), f"shards[{i}].sha256", where),
        )
        if entry.url.startswith("/") or "://" in entry.url or ".." in entry.url.split("/"):
            raise ManifestError(f"shards[{i}].url {entry.url!r} must be relative to the index", where=where)
        if not entry.url or "\0" in entry.url:
            raise ManifestError(f"shards[{i}].url {entry.url!r} is empty or holds a NUL character",
                                where=where)
        if not SHA256_RE.fullmatch(entry.sha256):
            raise ManifestError(f"shards[{i}].sha256 {entry.sha256[:80]!r} of {entry.url!r} is not 64 "
                                "lower-case hex digits", where=where)
        if entry.num_samples * _MIN_SAMPLE_BYTES > entry.num_bytes:
            raise ManifestError(f"shards[{i}] ({entry.url!r}) claims {entry.num_samples} samples in "
                                f"{entry.num_bytes} bytes (each sample takes at least {_MIN_SAMPLE_BYTES})",
                                where=where)
        shards.append(entry)
    seen: dict[str, int] = {}
    for i, entry in enumerate(shards):
        if entry.url in seen:
            raise ManifestError(f"shards[{i}].url {entry.url!r} is listed twice (also shards[{seen[entry.url]}]): its "
                                "samples would be read twice an epoch", where=where)
        seen[entry.url] = i
    return shards


_BAD_URLS = re.compile(r"(?m)^$|^/|://|(?:^|/)\.\.(?:/|$)|\x00")
_HEX = re.compile(r"[0-9a-f]*")


def _shard_table_fast(raw: list[Any]) -> ShardTable | None:
    """The shards as a table when every entry is valid, else None (then :func:`_shard_entries`
    finds and names the flaw). Whole-array checks on columns, no object per shard: 1e5 shards
    validate in about 0.1 s on one core, after the JSON parse."""
    try:
        urls = [s["url"] for s in raw]
        counts = [s["num_samples"] for s in raw]
        sizes = [s["num_bytes"] for s in raw]
        shas = [s["sha256"] for s in raw]
    except (TypeError, KeyError):
        return None
    if {type(x) for x in urls} - {str} or {type(x) for x in shas} - {str}:
        return None
    if {type(x) for x in counts} - {int} or {type(x) for x in sizes} - {int}:  # type(): bool is refused
        return None
    joined = "\n".join(urls)
    if (joined.count("\n") != len(urls) - 1 or min(map(len, urls), default=1) == 0 or "\x00" in joined
            or "://" in joined or joined.startswith("/") or "\n/" in joined
            or (".." in joined and _BAD_URLS.search(joined))):
        return None
    if len(set(urls)) != len(urls):
        return None
    hexes = "".join(shas)
    if len(hexes) != 64 * len(shas) or {len(h) for h in shas} - {64} or not _HEX.fullmatch(hexes):
        return None
    if max(sizes, default=0) >= _fields.MAX_INTEGER or max(counts, default=0) >= _fields.MAX_INTEGER:
        return None
    if min(counts, default=0) < 0 or min(sizes, default=0) < 0:
        return None
    num_samples, num_bytes = np.array(counts, dtype=np.int64), np.array(sizes, dtype=np.int64)
    if np.any(num_samples > num_bytes // _MIN_SAMPLE_BYTES):
        return None
    return ShardTable(urls, num_samples, num_bytes, bytes.fromhex(hexes))
