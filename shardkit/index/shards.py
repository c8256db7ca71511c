"""A dataset's shard list, held by column: sample counts and sizes as int64 arrays, names by
pattern or list, hashes as raw bytes or read by block when a shard asks for its own.

The loader plans epochs from the counts and opens shards one at a time, so it needs neither a
Python object per shard nor every hash up front: ``table[i]`` makes the :class:`ShardEntry`
of shard ``i`` when it is asked for, and a table read from ``index.table``
(:mod:`shardkit.index.table`) fetches shard ``i``'s sha256 by its block of
:data:`HASH_BLOCK` hashes, checked against the block's digest, the first time it is needed.

Example::

    t = ShardTable.from_entries([ShardEntry("s-000000.tar", 2, 10240, "a" * 64)])
    t.num_samples.sum(), t[0].url, t.fingerprint
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from shardkit.format.spec import shard_name

#: Shards per block of the hash column: ``index.hashes`` is read (and checked) a block at a time,
#: and a dataset's :attr:`ShardTable.fingerprint` digests the blocks' digests. Part of the format.
#: 64 hashes (2 KiB) per block: a process's first batch reads a block per shard it opens (8 with
#: the default window), so 64 processes of a node read about 1 MB of hashes before their first
#: batches; the blocks' digests add 0.5 byte per shard to the table.
HASH_BLOCK = 64
#: Bytes of one shard's sha256 in the hash column.
HASH_BYTES = 32


@dataclass(frozen=True)
class ShardEntry:
    """One shard: ``url`` relative to the index, its sample count, size and sha256."""

    url: str
    num_samples: int
    num_bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "num_samples": self.num_samples, "num_bytes": self.num_bytes,
                "sha256": self.sha256}


def block_digests(hashes: bytes) -> bytes:
    """The sha256 of each :data:`HASH_BLOCK` raw hashes of ``hashes``, one after another.

    >>> len(block_digests(bytes(32 * 65)))
    64
    """
    step = HASH_BLOCK * HASH_BYTES
    return b"".join(hashlib.sha256(hashes[i:i + step]).digest() for i in range(0, len(hashes), step))


class NamedShards(Sequence[str]):
    """Shard names ``<prefix>-<NNNNNN>.tar`` numbered from 0 (what ``shardkit pack`` writes).

    >>> list(NamedShards("s", 2)), NamedShards.of(["s-000000.tar", "x.tar"])
    (['s-000000.tar', 's-000001.tar'], None)
    """

    def __init__(self, prefix: str, count: int) -> None:
        self.prefix, self.length = prefix, count

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [shard_name(self.prefix, j) for j in range(self.length)[i]]
        if not -self.length <= i < self.length:
            raise IndexError(f"shard {i} out of range ({self.length} shards)")
        return shard_name(self.prefix, i % self.length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NamedShards):
            return (self.prefix, self.length) == (other.prefix, other.length)
        return list(self) == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[str]:
        prefix = self.prefix
        return (f"{prefix}-{i:06d}.tar" for i in range(self.length))

    @staticmethod
    def of(urls: Sequence[str]) -> NamedShards | None:
        """``urls`` as a pattern, when they are exactly ``shard_name(prefix, 0..n-1)`` of one prefix."""
        if not urls or not urls[0].endswith("-000000.tar"):
            return None
        named = NamedShards(urls[0][: -len("-000000.tar")], len(urls))
        if "/" in named.prefix or "\\" in named.prefix or named.prefix.startswith(".") or not named.prefix:
            return None
        return named if all(u == named[i] for i, u in enumerate(urls)) else None


class BlockHashes:
    """Hashes fetched a block at a time by ``fetch(block) -> bytes``, each block checked against
    its digest in ``digests`` (``check(block, data)`` raises naming the file). Picklable when
    ``fetch`` and ``check`` are; blocks already fetched travel with it."""

    def __init__(self, count: int, digests: bytes, fetch: Callable[[int], bytes],
                 check: Callable[[int, bytes], None]) -> None:
        self.count, self.digests, self._fetch, self._check = count, digests, fetch, check
        self._blocks: dict[int, bytes] = {}

    def block(self, b: int) -> bytes:
        data = self._blocks.get(b)
        if data is None:
            data = self._fetch(b)
            self._check(b, data)
            self._blocks[b] = data
        return data

    def raw(self, i: int) -> bytes:
        b, j = divmod(i, HASH_BLOCK)
        return self.block(b)[j * HASH_BYTES:(j + 1) * HASH_BYTES]

    def all(self) -> bytes:
        return b"".join(self.block(b) for b in range(len(self.digests) // HASH_BYTES))


class ShardTable(Sequence[ShardEntry]):
    """The shards of a dataset, by column (see the module). A sequence of :class:`ShardEntry`;
    equal to another table (or sequence of entries) holding the same entries.

    ``num_samples`` and ``num_bytes`` are read-only int64 arrays; ``urls`` is any sequence of
    str (a list, a :class:`NamedShards` pattern); ``hashes`` is the raw sha256 bytes (32 per
    shard) or a :class:`BlockHashes`; ``digests`` the hash blocks' digests (computed when None).
    Nothing is validated here: :mod:`shardkit.index.manifest` and :mod:`shardkit.index.table`
    validate what they read before they make a table.
    """

    def __init__(self, urls: Sequence[str], num_samples: npt.NDArray[np.int64], num_bytes: npt.NDArray[np.int64],
                 hashes: bytes | BlockHashes, digests: bytes | None = None) -> None:
        self.urls = urls
        self.num_samples, self.num_bytes = num_samples, num_bytes
        for column in (num_samples, num_bytes):
            column.flags.writeable = False
        self._hashes = hashes
        if digests is None:
            digests = hashes.digests if isinstance(hashes, BlockHashes) else block_digests(hashes)
        self.digests = digests

    @classmethod
    def from_entries(cls, entries: Sequence[ShardEntry]) -> ShardTable:
        """A table of ``entries`` (their hashes must be 64 lower-case hex digits); a table is
        returned as it is."""
        if isinstance(entries, ShardTable):
            return entries
        entries = tuple(entries)
        urls = [e.url for e in entries]
        return cls(urls,
                   np.fromiter((e.num_samples for e in entries), np.int64, len(entries)),
                   np.fromiter((e.num_bytes for e in entries), np.int64, len(entries)),
                   bytes.fromhex("".join(e.sha256 for e in entries)))

    @staticmethod
    def join(tables: Sequence[ShardTable]) -> ShardTable:
        """The shards of ``tables`` one after another (a mix's joined shard index)."""
        if len(tables) == 1:
            return tables[0]
        return _JoinedTable(tables)

    def __len__(self) -> int:
        return len(self.num_samples)

    def sha256(self, i: int) -> str:
        """Shard ``i``'s sha256, as lower-case hex (fetched with its block when read lazily)."""
        if isinstance(self._hashes, BlockHashes):
            return self._hashes.raw(i).hex()
        return self._hashes[i * HASH_BYTES:(i + 1) * HASH_BYTES].hex()

    def hashes(self) -> bytes:
        """Every shard's raw sha256 (32 bytes each), fetching blocks not read yet."""
        return self._hashes.all() if isinstance(self._hashes, BlockHashes) else self._hashes

    @property
    def fingerprint(self) -> str:
        """sha256 over the hash blocks' digests: a fingerprint of every shard's hash, in order,
        known without reading the hashes themselves (resume states are bound to it)."""
        return hashlib.sha256(self.digests).hexdigest()

    def entry(self, i: int) -> ShardEntry:
        if not -len(self) <= i < len(self):
            raise IndexError(f"shard {i} out of range ({len(self)} shards)")
        i %= len(self)
        return ShardEntry(self.urls[i], int(self.num_samples[i]), int(self.num_bytes[i]), self.sha256(i))

    @overload
    def __getitem__(self, i: int) -> ShardEntry: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[ShardEntry, ...]: ...

    def __getitem__(self, i: int | slice) -> ShardEntry | tuple[ShardEntry, ...]:
        if isinstance(i, slice):
            return tuple(self.entry(j) for j in range(len(self))[i])
        return self.entry(i)

    def __iter__(self) -> Iterator[ShardEntry]:
        return (self.entry(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardTable):
            return (len(self) == len(other) and np.array_equal(self.num_samples, other.num_samples)
                    and np.array_equal(self.num_bytes, other.num_bytes) and list(self.urls) == list(other.urls)
                    and self.digests == other.digests)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards, {int(self.num_samples.sum())} samples)"


class _JoinedTable(ShardTable):
    """Several tables' shards one after another; each keeps its own hashes."""

    def __init__(self, tables: Sequence[ShardTable]) -> None:
        self._tables = tuple(tables)
        self._firsts = list(np.cumsum([0] + [len(t) for t in tables[:-1]]))
        super().__init__(_JoinedUrls(self), np.concatenate([t.num_samples for t in tables]),
                         np.concatenate([t.num_bytes for t in tables]), b"",
                         digests=b"".join(t.digests for t in tables))

    def locate(self, i: int) -> tuple[ShardTable, int]:
        part = bisect.bisect_right(self._firsts, i) - 1
        return self._tables[part], i - int(self._firsts[part])

    def sha256(self, i: int) -> str:
        table, j = self.locate(i)
        return table.sha256(j)

    def hashes(self) -> bytes:
        return b"".join(t.hashes() for t in self._tables)

    @property
    def fingerprint(self) -> str:
        raise TypeError("a joined table has no fingerprint of its own: take each dataset's")


class _JoinedUrls(Sequence[str]):
    def __init__(self, table: _JoinedTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table.num_samples)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        table, j = self._table.locate(i)
        return table.urls[j]


__all__ = ["HASH_BLOCK", "HASH_BYTES", "BlockHashes", "NamedShards", "ShardEntry", "ShardTable", "block_digests"]
