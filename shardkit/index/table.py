"""``index.table`` and ``index.hashes``: ``index.json`` by column, read without parsing the JSON.

At 5e5 shards ``index.json`` is ~86 MB of JSON (seconds to parse and validate, per process);
the table holds the same dataset in a few MB (sample counts and sizes as little-endian integer
columns, shard names as a pattern where they follow ``shard_name(prefix, i)``, the other fields
of ``index.json`` as a small JSON head), and the shards' sha256s live beside it in
``index.hashes`` (32 raw bytes each), read a block of :data:`~shardkit.index.shards.HASH_BLOCK`
at a time when a shard is opened and checked against the block's digest in the table. Layout
(docs/concepts/format.md §10)::

    b"shardkit-table 1\\n"
    u32le head length, head (UTF-8 JSON object)
    zlib stream of the body: num_samples column, num_bytes column, hash block digests (32 bytes
    each), then, unless the head's "urls" gives the pattern, the urls joined by NUL (UTF-8)

Everything is checked with whole-array operations before a table is made: the head's fields
and types, the body's exact length (decompression stops one byte past it), counts below 2**63,
at most ``num_bytes // 512`` samples per shard, urls relative and NUL-free. Errors are
``ManifestError`` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from shardkit.errors import ManifestError, StorageError
from shardkit.format.spec import HASHES_NAME, TABLE_NAME, TABLE_VERSIONS, check_prefix
from shardkit.index.shards import HASH_BLOCK, HASH_BYTES, BlockHashes, NamedShards, ShardTable, block_digests

_MAGIC = b"shardkit-table "
#: The most shards a table may list (sixteen million: 30 times ImageNet-21k's shards at 1 GB each).
MAX_SHARDS = 1 << 24
#: The largest head (the non-shard fields of ``index.json``: classes, COCO categories, skipped inputs).
MAX_HEAD_BYTES = 64 << 20
#: Column types a table may use: 32-bit where every value fits, else 64-bit.
_DTYPES = ("<u4", "<u8")
#: The fewest bytes a shard of ``n`` samples has (one tar header per sample, as in index.json).
_MIN_SAMPLE_BYTES = 512
_BAD_URL = re.compile(r"(?:^|\x00)(?:/|\x00|$)|://|(?:^|/|\x00)\.\.(?:/|\x00|$)")


def _column(values: npt.NDArray[np.int64]) -> tuple[str, bytes]:
    dtype = "<u4" if values.size == 0 or int(values.max()) < (1 << 32) else "<u8"
    return dtype, values.astype(dtype).tobytes()


def encode_table(head: dict[str, Any], shards: ShardTable, *, index_bytes: int) -> tuple[bytes, bytes]:
    """``(index.table, index.hashes)`` for ``shards`` and ``head``, the other fields of
    ``index.json``, which is ``index_bytes`` long; deterministic (the same dataset gives the
    same bytes)."""
    urls = shards.urls
    named = urls if isinstance(urls, NamedShards) else NamedShards.of(urls)
    hashes = shards.hashes()
    counts_type, counts = _column(shards.num_samples)
    sizes_type, sizes = _column(shards.num_bytes)
    body = counts + sizes + block_digests(hashes)
    if named is None:
        body += "\0".join(urls).encode("utf-8", "backslashreplace")
    doc = {"manifest": head, "num_shards": len(shards),
           "urls": None if named is None else {"prefix": named.prefix},
           "columns": {"num_samples": counts_type, "num_bytes": sizes_type},
           "hashes": {"url": HASHES_NAME, "block": HASH_BLOCK}, "body_bytes": len(body), "index_bytes": index_bytes}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    encoded = text.encode("utf-8", "backslashreplace")
    table = (_MAGIC + f"{TABLE_VERSIONS[-1]}\n".encode() + struct.pack("<I", len(encoded)) + encoded
             + zlib.compress(body, 6))
    return table, hashes


class HashFile:
    """Fetch block ``b`` of ``index.hashes`` (at ``where``) through ``read_range(offset, length)``
    (picklable when ``read_range`` is)."""

    def __init__(self, read_range: Callable[[int, int], bytes], count: int, where: str = HASHES_NAME) -> None:
        self.read_range, self.count, self.where = read_range, count, where

    def __call__(self, b: int) -> bytes:
        first = b * HASH_BLOCK
        try:
            return self.read_range(first * HASH_BYTES, min(HASH_BLOCK, self.count - first) * HASH_BYTES)
        except StorageError as err:
            if not isinstance(err.__cause__, FileNotFoundError):
                raise
            dataset = self.where.rsplit("/", 1)[0] if "/" in self.where else "."
            raise ManifestError(f"missing, though {TABLE_NAME} names it (copy it with the dataset, or write it again: "
                                f"`shardkit index --table {dataset}`)", where=self.where) from err


def _field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ManifestError(f"table head field {key!r} is missing or of the wrong type", where=where)
    return value


def decode_table(data: bytes, *, where: str, read_hashes: Callable[[int, int], bytes],
                 hashes_where: str) -> tuple[dict[str, Any], int, ShardTable]:
    """``(the other fields of index.json, its length in bytes, the shards)`` of an ``index.table``; the shards' hashes
    are read from ``index.hashes`` by ``read_hashes(offset, length)`` a block at a time, when
    asked for (picklable when ``read_hashes`` is).

    Raises:
        ManifestError: not a table, a version this shardkit does not read, or any check of the
            module's failing (naming ``where``, or ``hashes_where`` for a hash block).
    """
    line, sep, rest = data.partition(b"\n")
    if not sep or not line.startswith(_MAGIC):
        raise ManifestError("not a shardkit table (it does not start with 'shardkit-table')", where=where)
    version = line[len(_MAGIC):].decode("ascii", "replace")
    if not version.isdigit() or int(version) not in TABLE_VERSIONS:
        raise ManifestError(f"table version {version[:20]!r} is not supported (this shardkit reads "
                            f"{', '.join(map(str, TABLE_VERSIONS))})", where=where)
    if len(rest) < 4:
        raise ManifestError("table ends before its head", where=where)
    (head_len,) = struct.unpack_from("<I", rest)
    if head_len > min(MAX_HEAD_BYTES, len(rest) - 4):
        raise ManifestError(f"table head claims {head_len} bytes, more than the file holds", where=where)
    try:
        doc = json.loads(rest[4:4 + head_len])
    except (ValueError, RecursionError) as err:
        raise ManifestError(f"table head is not valid JSON ({str(err)[:100]})", where=where) from err
    if not isinstance(doc, dict):
        raise ManifestError("table head is not a JSON object", where=where)
    n = _field(doc, "num_shards", int, where)
    if not 0 <= n <= MAX_SHARDS:
        raise ManifestError(f"table lists {n} shards (at most {MAX_SHARDS})", where=where)
    head = _field(doc, "manifest", dict, where)
    columns = _field(doc, "columns", dict, where)
    types = [columns.get("num_samples"), columns.get("num_bytes")]
    if any(t not in _DTYPES for t in types):
        raise ManifestError(f"table columns {columns!r} are not of types {_DTYPES}"[:200], where=where)
    spec = _field(doc, "hashes", dict, where)
    if spec.get("url") != HASHES_NAME or spec.get("block") != HASH_BLOCK:
        raise ManifestError(f"table hashes {spec!r} are not {{'url': {HASHES_NAME!r}, 'block': {HASH_BLOCK}}}"[:200],
                            where=where)
    urls_spec = doc.get("urls")
    if urls_spec is not None and not (isinstance(urls_spec, dict) and isinstance(urls_spec.get("prefix"), str)):
        raise ManifestError("table head field 'urls' must be null or {\"prefix\": str}", where=where)
    body_len = _field(doc, "body_bytes", int, where)
    index_bytes = _field(doc, "index_bytes", int, where)
    blocks = -(-n // HASH_BLOCK)
    fixed = n * sum(int(t[-1]) for t in types) + blocks * HASH_BYTES
    if body_len < fixed or (urls_spec is not None and body_len != fixed) or body_len > 64 * MAX_HEAD_BYTES:
        raise ManifestError(f"table body of {body_len} bytes cannot hold {n} shards", where=where)
    body = _inflate(rest[4 + head_len:], body_len, where)
    counts = _read_column(body, 0, n, types[0], "num_samples", where)
    sizes = _read_column(body, n * int(types[0][-1]), n, types[1], "num_bytes", where)
    digests = body[n * (int(types[0][-1]) + int(types[1][-1])):fixed]
    if np.any(counts > sizes // _MIN_SAMPLE_BYTES):
        i = int(np.argmax(counts > sizes // _MIN_SAMPLE_BYTES))
        raise ManifestError(f"shard {i} claims {counts[i]} samples in {sizes[i]} bytes (each sample takes at least "
                            f"{_MIN_SAMPLE_BYTES})", where=where)
    urls = _urls(urls_spec, body[fixed:], n, where)
    check: Callable[[int, bytes], None] = _BlockCheck(digests, hashes_where, n)
    hashes = BlockHashes(n, digests, HashFile(read_hashes, n, hashes_where), check)
    return head, index_bytes, ShardTable(urls, counts, sizes, hashes, digests)


def _inflate(data: bytes, size: int, where: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data, size + 1)
    except zlib.error as err:
        raise ManifestError(f"table body is damaged ({err})", where=where) from err
    if len(body) != size or not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
        raise ManifestError(f"table body holds {len(body)}{'+' if len(body) > size else ''} bytes, its head says "
                            f"{size} (truncated or damaged)", where=where)
    return body


def _read_column(body: bytes, offset: int, n: int, dtype: str, what: str, where: str) -> npt.NDArray[np.int64]:
    values = np.frombuffer(body, dtype=dtype, count=n, offset=offset)
    if dtype == "<u8" and n and int(values.max()) >= (1 << 63):
        raise ManifestError(f"shard {int(np.argmax(values >= (1 << 63)))}'s {what} is 2**63 or more", where=where)
    return values.astype(np.int64)


def _urls(spec: dict[str, str] | None, blob: bytes, n: int, where: str) -> NamedShards | list[str]:
    if spec is not None:
        try:
            return NamedShards(check_prefix(spec["prefix"]), n)
        except ValueError as err:
            raise ManifestError(f"table urls: {err}", where=where) from err
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManifestError(f"table urls are not UTF-8 ({err})", where=where) from err
    urls = text.split("\0") if n else []
    if len(urls) != n or (n and _BAD_URL.search(text)):
        bad = next((u for u in urls if not u or u.startswith("/") or "://" in u or ".." in u.split("/")), None)
        what = f"url {bad!r} is empty or not relative to the index" if bad is not None else (
            f"{len(urls)} urls for {n} shards")
        raise ManifestError(f"table {what}"[:300], where=where)
    if len(set(urls)) != n:
        twice = next(u for u, k in Counter(urls).items() if k > 1)
        raise ManifestError(f"table lists shard {twice!r} twice: its samples would be read twice an epoch"[:300],
                            where=where)
    return urls


class _BlockCheck:
    """Refuse a block of ``index.hashes`` (at ``where``, for ``count`` shards) whose digest differs
    from the table's (picklable)."""

    def __init__(self, digests: bytes, where: str, count: int) -> None:
        self.digests, self.where, self.count = digests, where, count

    def __call__(self, b: int, data: bytes) -> None:
        want = self.digests[b * HASH_BYTES:(b + 1) * HASH_BYTES]
        if hashlib.sha256(data).digest() != want:
            first, last = b * HASH_BLOCK, min(self.count, (b + 1) * HASH_BLOCK) - 1
            got = hashlib.sha256(data).hexdigest()[:16]
            dataset = self.where.rsplit("/", 1)[0] if "/" in self.where else "."
            raise ManifestError(f"damaged or stale: block {b} (the hashes of shards {first} to {last}) has "
                                f"{len(data)} bytes with sha256 {got}…, the table says another (write it again: "
                                f"`shardkit index --table {dataset}`)", where=self.where)


__all__ = ["MAX_SHARDS", "HashFile", "decode_table", "encode_table"]
