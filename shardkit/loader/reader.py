"""Random access to samples of a packed dataset: ``(shard, index) -> {ext: bytes}``.

Local shards are read with ``os.pread`` at offsets from the ``.idx`` files. Remote shards are
first copied whole into a local :class:`~shardkit.loader.cache.ShardCache` (keyed by content
hash, fetched once per node, bounded), then read the same way. Open files are kept in a small LRU.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from shardkit.errors import FormatError, LoaderError, StorageError
from shardkit.format.offsets import load_offsets
from shardkit.format.spec import offsets_name
from shardkit.format.tarread import parse_span, scan_spans
from shardkit.index.manifest import ShardEntry
from shardkit.loader.cache import DEFAULT_CACHE_BYTES, ShardCache
from shardkit.storage import Store


class _OpenShard:
    def __init__(self, fd: int, offsets: list[tuple[int, int]], keys: list[str]) -> None:
        self.fd = fd
        self.size = os.fstat(self.fd).st_size
        self.offsets = offsets
        self.keys = keys

    def close(self) -> None:
        os.close(self.fd)


class ShardReader:
    """Read samples by ``(shard index, sample index in shard)``; picklable, opens lazily.

    ``cache_dir`` holds local copies of remote shards (created if missing), at most about
    ``cache_bytes`` (see :class:`~shardkit.loader.cache.ShardCache`); at most ``max_open``
    shards stay open.
    """

    def __init__(self, store: Store, shards: tuple[ShardEntry, ...], *, cache_dir: str | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, max_open: int = 16) -> None:
        self.store = store
        self.shards = shards
        self.cache = ShardCache(cache_dir, cache_bytes) if cache_dir is not None else None
        self.max_open = max_open
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        return state

    def _open_fd(self, entry: ShardEntry) -> int:
        if not self.store.remote:
            return os.open(self.store.path(entry.url), os.O_RDONLY)
        if self.cache is None:
            raise LoaderError("a remote dataset needs a cache_dir for its shards", where=self.store.url)
        return self.cache.open(self.store, entry)

    def key(self, shard_index: int, sample_index: int) -> str:
        """The key of one sample (from the shard's offsets; opens the shard if needed)."""
        return self._shard(shard_index).keys[sample_index]

    def _shard(self, i: int) -> _OpenShard:
        shard = self._open.get(i)
        if shard is not None:
            self._open.move_to_end(i)
            return shard
        entry = self.shards[i]
        where = self.store.path(entry.url)
        fd = -1
        try:
            fd = self._open_fd(entry)
            idx = offsets_name(entry.url)
            raw = self.store.read_optional(idx)
            if raw is not None:
                spans = [(s.key, s.offset, s.size) for s in load_offsets(raw, where=self.store.path(idx))]
            else:
                with os.fdopen(os.dup(fd), "rb") as f:
                    spans = scan_spans(f, where=where)
            shard = _OpenShard(fd, [(o, n) for _, o, n in spans], [k for k, _, _ in spans])
        except (StorageError, OSError) as err:
            if fd >= 0:
                os.close(fd)
            detail = err.message if isinstance(err, StorageError) else str(err)
            raise LoaderError(f"cannot read shard ({detail})", where=where) from err
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        if len(shard.offsets) != entry.num_samples:
            shard.close()
            raise LoaderError(f"shard has {len(shard.offsets)} samples, index.json says {entry.num_samples}", where=where)
        self._open[i] = shard
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return shard

    def read(self, shard_index: int, sample_index: int) -> tuple[str, dict[str, bytes]]:
        """The key and ``{ext: bytes}`` fields of one sample.

        Raises:
            LoaderError: the shard is missing, truncated or does not match the manifest
                (names the shard and sample).
        """
        shard = self._shard(shard_index)
        offset, size = shard.offsets[sample_index]
        where = f"{self.store.path(self.shards[shard_index].url)}:{shard.keys[sample_index]}"
        if offset + size > shard.size:
            raise LoaderError(f"shard is truncated ({shard.size} bytes, sample ends at {offset + size})", where=where)
        data = os.pread(shard.fd, size, offset)
        try:
            return parse_span(data, where=where)
        except FormatError as err:
            raise LoaderError(f"corrupt shard: {err.message}", where=where) from err

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


__all__ = ["ShardReader"]
