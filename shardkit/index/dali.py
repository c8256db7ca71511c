"""Write DALI index files (``<shard>.dali.idx``, docs/concepts/format.md §9) beside a dataset's shards."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shardkit.format.dali_index import dali_index_name, dump_dali_index
from shardkit.format.tarread import iter_entries
from shardkit.index.manifest_io import read_manifest
from shardkit.storage import Store


def write_dali_index(store: Store, shard: str) -> str | None:
    """Write the DALI index of ``shard`` (a name in ``store``), reading only its tar headers.

    Returns the index file's name, or ``None`` for a shard without members (every input skipped),
    which DALI's format cannot describe: none is written. Raises ``FormatError`` (names the
    shard) when the shard is not a readable tar or a member name holds whitespace.
    """
    where = store.path(shard)
    with store.open_read(shard) as f:
        entries = list(iter_entries(f, where=where, read_data=False, seekable=True))
    if not entries:
        return None
    name = dali_index_name(shard)
    store.write_bytes(name, dump_dali_index(entries, where=where))
    return name


def write_dali_indexes(url: str, *, storage_options: dict[str, Any] | None = None,
                       shards: Iterable[str] | None = None) -> list[str | None]:
    """Write DALI index files for every shard of the dataset at ``url`` (from its ``index.json``,
    or the given ``shards``); ``index.json`` and the shards are not touched.

    Example: ``write_dali_indexes("shards/")`` -> ``["shard-000000.dali.idx", ...]``.

    Raises:
        ManifestError: no ``shards`` given and ``url`` holds no valid ``index.json``.
        FormatError: a shard is not a readable tar (names it).
    """
    store = Store(url, storage_options)
    names = list(shards) if shards is not None else [s.url for s in read_manifest(store).shards]
    return [write_dali_index(store, name) for name in names]
