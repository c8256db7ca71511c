"""A dataset's manifest in its store: locate the dataset, read ``index.json`` or its table, write them.

The fields and their checks are :class:`~shardkit.index.manifest.Manifest`'s; here are the files:
which to read (only the first bytes of an ``index.json`` that names its ``index.table``), what to
say where there is none, and the order of the writes (``index.json`` always last).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import stat
from typing import Any

from shardkit.errors import ManifestError, StorageError
from shardkit.format.spec import FORMAT_NAME, HASHES_NAME, INDEX_NAME, PACK_STATE_DIR, TABLE_NAME
from shardkit.index._shard_list import SHA256_RE
from shardkit.index.manifest import MAX_MANIFEST_BYTES, Manifest
from shardkit.index.shards import HASH_BYTES
from shardkit.index.table import decode_table, encode_table
from shardkit.storage import Store
from shardkit.storage.copies import cached_copy

log = logging.getLogger("shardkit.index")


def locate_dataset(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """The store holding a dataset given as a directory, URL prefix or ``.../index.json``."""
    base = (url[: -len(INDEX_NAME)].rstrip("/") if url.rstrip("/").endswith("/" + INDEX_NAME)
            or url == INDEX_NAME else url)
    return Store(base or ".", storage_options)


#: Bytes read first from ``index.json``: enough for the fields before ``table`` as shardkit writes them.
_HEAD_BYTES = 4096
_TABLE_REF = re.compile(rb'\A\{\s*"format":\s*"shardkit",\s*"version":\s*(\d{1,9}),\s*"kind":\s*"([a-z]{1,32})",'
                        rb'(?:\s*"kind_version":\s*(\d{1,9}),)?\s*"num_samples":\s*(\d{1,20}),\s*"table":\s*')


def read_manifest(store: Store, *, cache_dir: str | None = None, table: bool = True,
                  strict_table: bool = False) -> Manifest:
    """Read and validate the manifest of the dataset in ``store``.

    When ``index.json`` names an ``index.table`` (docs/concepts/format.md §10), only its first
    bytes are read and the manifest comes from the table, which must have the sha256 that
    ``index.json`` gives it (its shards' hashes are read by block when asked for); else, or with
    ``table=False``, from ``index.json`` in full. A table that is missing or stale (written with
    another ``index.json``: one edited by a JSON tool since, or another dataset's) is passed over
    with a warning naming it, once per process, and ``index.json`` is read in full, as it is
    what the table stands for; ``strict_table=True`` raises instead (``shardkit verify``).
    ``cache_dir``: a remote dataset's table is fetched once into this directory and shared by the
    node's processes (:func:`~shardkit.storage.copies.cached_copy`).

    Raises:
        ManifestError: no index (not a packed dataset, or a pack that did not finish), an
            invalid one, a table that is invalid, or with ``strict_table`` one that is missing
            or stale, naming the file.
    """
    where = store.path(INDEX_NAME)
    head = _read_head(store) if table else None
    ref = _table_ref(head, where) if head is not None else None
    if ref is not None:
        try:
            return _read_table(store, ref, cache_dir)
        except StaleTable as err:
            if strict_table:
                raise
            _warn_once(err)
            if err.index is not None:  # read in full already, to tell a rewritten index.json from a damaged one
                return err.index
    if head is not None and len(head) < _HEAD_BYTES:  # the whole file
        return Manifest.from_json(head, where=where)
    if not store.exists(INDEX_NAME):
        _no_index(store)
    if not store.remote and store.size(INDEX_NAME) > MAX_MANIFEST_BYTES:  # refused unread
        raise ManifestError(f"is larger than {MAX_MANIFEST_BYTES} bytes, the most a manifest may have", where=where)
    return Manifest.from_json(store.read_bytes(INDEX_NAME, limit=MAX_MANIFEST_BYTES + 1), where=where)


def names_table(store: Store) -> bool:
    """Whether the dataset's ``index.json`` names an ``index.table`` (reads its first bytes).

    Raises:
        ManifestError: no ``index.json``, or a malformed ``table`` field.
    """
    return _table_ref(_read_head(store), store.path(INDEX_NAME)) is not None


#: A webdataset shard pattern: a brace range anywhere, or a glob in the last part of a path to .tar
#: files (``/data/exp[1]/ds`` is a folder's name, not one).
_SHARD_PATTERN = re.compile(r"\{[^{}]*\.\.[^{}]*\}|\*|[?\[][^/]*\.tar$")


def _no_index(store: Store) -> None:
    """Raise what a folder without ``index.json`` is and what to do, alone: not chained to the
    read that found it missing (a traceback of two errors for one missing file)."""
    path = store.url.split("?", 1)[0] if store.url.startswith(("http://", "https://")) else store.url  # no query
    pattern = ("; a dataset is given as its folder, not a webdataset shard pattern: pass the folder (run "
               "`shardkit index FOLDER` first if it has no index.json)" if _SHARD_PATTERN.search(path) else "")
    if not store.remote and not os.path.isdir(store.path("")):
        what = "is a file, not a dataset directory" if os.path.exists(store.path("")) else "does not exist"
        raise ManifestError(f"{what} (a packed dataset is a directory holding index.json){pattern}",
                            where=store.url) from None
    instead = pattern if store.remote and pattern else f" ({_what_instead(store)})"  # a folder here is no pattern
    raise ManifestError(f"no index.json: not a shardkit dataset{instead}", where=store.url) from None


def _read_head(store: Store) -> bytes:
    """The first :data:`_HEAD_BYTES` of ``index.json`` (all of a smaller one)."""
    try:
        return store.read_bytes(INDEX_NAME, limit=_HEAD_BYTES)
    except StorageError as err:
        if isinstance(err.__cause__, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            _no_index(store)
        raise


def _table_ref(head: bytes, where: str) -> dict[str, Any] | None:
    """``index.json``'s reference to its table (``{url, num_bytes, sha256}``), or None when it
    names none where shardkit writes it (right after ``num_samples``)."""
    found = _TABLE_REF.match(head)
    if found is None:
        return None
    try:
        ref, _ = json.JSONDecoder().raw_decode(head[found.end():].decode("utf-8", "replace"))
    except ValueError:
        ref = None
    if (not isinstance(ref, dict) or ref.get("url") != TABLE_NAME or not isinstance(ref.get("sha256"), str)
            or not SHA256_RE.fullmatch(ref["sha256"]) or type(ref.get("num_bytes")) is not int
            or not 0 < ref["num_bytes"] <= MAX_MANIFEST_BYTES):
        raise ManifestError(f"field 'table' must be {{\"url\": \"{TABLE_NAME}\", \"num_bytes\": <at most "
                            f"{MAX_MANIFEST_BYTES}>, \"sha256\": <64 hex digits>}}", where=where)
    version, kind, num_samples = int(found[1]), found[2].decode(), int(found[4])
    head_fields: dict[str, Any] = {"format": FORMAT_NAME, "version": version, "kind": kind}
    if found[3] is not None:  # captions write theirs between kind and num_samples
        head_fields["kind_version"] = int(found[3])
    Manifest._check_format(head_fields, where)
    return {**ref, "version": version, "kind": kind, "num_samples": num_samples}


def _read_table(store: Store, ref: dict[str, Any], cache_dir: str | None) -> Manifest:
    where = store.path(TABLE_NAME)

    def fetch() -> bytes:
        try:
            data = store.read_bytes(TABLE_NAME, limit=ref["num_bytes"] + 1)
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):
                raise StaleTable(f"missing, though {INDEX_NAME} names it (copy it with the dataset, or write it "
                                    f"again: `shardkit index --table {store.url}`)", where=where) from err
            raise
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != ref["num_bytes"] or digest != ref["sha256"]:
            raise StaleTable(f"stale or damaged: {len(data)}{'+' if len(data) > ref['num_bytes'] else ''} bytes "
                                f"with sha256 {digest[:16]}…, {INDEX_NAME} names {ref['num_bytes']} bytes with "
                                f"{ref['sha256'][:16]}… (write it again: `shardkit index --table {store.url}`)",
                                where=where)
        return data

    data = (cached_copy(cache_dir, f"{ref['sha256']}.table", ref["sha256"], fetch)
            if cache_dir is not None and store.remote else fetch())
    doc, index_bytes, shards = decode_table(data, where=where, hashes_where=store.path(HASHES_NAME),
                                            read_hashes=functools.partial(store.read_range, HASHES_NAME))
    found = {"version": doc.get("version"), "kind": doc.get("kind"), "num_samples": doc.get("num_samples"),
             "index_bytes": index_bytes}
    ref = {**ref, "index_bytes": store.size(INDEX_NAME)}  # an index.json rewritten (e.g. by a JSON tool) changes size
    for key, value in found.items():
        if value != ref[key]:
            whole = None
            if key == "index_bytes":  # rewritten, or cut short / damaged: say the latter where it is so
                whole = Manifest.from_json(store.read_bytes(INDEX_NAME, limit=MAX_MANIFEST_BYTES + 1),
                                           where=store.path(INDEX_NAME))
            what = key.replace("_", " ")
            raise StaleTable(f"stale: it was written with an {INDEX_NAME} whose {what} is {value!r}, this one's is "
                             f"{ref[key]!r} (write it again: `shardkit index --table {store.url}`)",
                             where=where, index=whole)
    if not store.remote:  # a stat here; remote: found missing or short when a block is read
        _check_hashes_size(store, len(shards))
    return Manifest.from_head(doc, shards, where=where)


def _check_hashes_size(store: Store, shards: int) -> None:
    """A local ``index.hashes`` must be a file of 32 bytes per shard (its content is checked block
    by block when read); else StaleTable, naming the fix. One stat."""
    where, fix = store.path(HASHES_NAME), f"`shardkit index --table {store.url}`"
    try:
        found = os.stat(where)
    except FileNotFoundError:
        raise StaleTable(f"missing, though {TABLE_NAME} names it (copy it with the dataset, or write it again: "
                         f"{fix})", where=where) from None
    except OSError as err:
        raise StaleTable(f"cannot be read ({err.strerror}) (write it again: {fix})", where=where) from err
    want = shards * HASH_BYTES
    if not stat.S_ISREG(found.st_mode):
        raise StaleTable(f"not a file (write it again: {fix})", where=where)
    if found.st_size != want:
        raise StaleTable(f"damaged or stale: {found.st_size:,} bytes, where {TABLE_NAME}'s {shards:,} "
                         f"{'shard needs' if shards == 1 else 'shards need'} {want:,} (32 each; write it again: "
                         f"{fix})", where=where)


class StaleTable(ManifestError):
    """``index.table`` is missing or was written with another ``index.json`` than the one beside it,
    or a local dataset's ``index.hashes`` is missing or of the wrong size;
    ``index``: that ``index.json``'s manifest where it was read in full to tell."""

    def __init__(self, message: str, *, where: str = "", index: Manifest | None = None) -> None:
        super().__init__(message, where=where)
        self.index = index


#: The tables already warned about in this process (a loader's ranks and rebuilds read them again).
_warned: set[str] = set()


def _warn_once(err: StaleTable) -> None:
    if err.where not in _warned:
        _warned.add(err.where)
        log.warning("shardkit: %s; read %s in full instead (slower to open for a large dataset)", err, INDEX_NAME)


def unfinished_pack(shards: int) -> str:
    """What a folder holding an unfinished ``shardkit pack`` (its :data:`PACK_STATE_DIR`) is, and what to do."""
    return (f"a `shardkit pack` not finished (running, or stopped), {shards:,} {'shard' if shards == 1 else 'shards'} "
            f"written so far ({PACK_STATE_DIR}/ holds its state): a stopped one resumes when the command that began "
            "it is run again")


def _what_instead(store: Store) -> str:
    """What to do with a directory that holds no ``index.json``, by what it does hold: tar shards
    are indexed in place, an ImageFolder tree (class folders) is packed; a bucket is not looked into."""
    pack = ("an ImageFolder tree becomes one with `shardkit pack DIR SHARDS`, a pack that did not finish resumes "
            "when re-run")
    index = "WebDataset shards written by another tool become one with `shardkit index DIR`"
    if store.remote:
        return f"{pack}; {index}"
    try:
        entries = [e for e in os.scandir(store.path("")) if not e.name.startswith(".")]
    except OSError:
        return f"{pack}; {index}"
    if os.path.isdir(store.path(PACK_STATE_DIR)):
        return f"it is {unfinished_pack(sum(e.name.endswith('.tar') for e in entries))}"
    if any(e.name.endswith(".tar") and e.is_file() for e in entries):
        return f"it holds .tar files: {index}; or, if they are a pack that did not finish, re-run it to resume"
    if any(e.is_dir() for e in entries):
        return ("it holds folders, as an ImageFolder tree does: pack it first, `shardkit pack DIR SHARDS`, and "
                "load SHARDS")
    return f"{pack}; {index}"


def write_table(store: Store) -> Manifest:
    """Write the dataset's ``index.table`` and ``index.hashes`` from its ``index.json`` (read in
    full), and ``index.json`` again naming them, in shardkit's layout (fields it does not know
    are not kept). For datasets written before the table existed, or a table found stale.

    Raises:
        ManifestError: no valid ``index.json``.
    """
    manifest = read_manifest(store, table=False)
    write_manifest(store, manifest)
    return manifest


def write_manifest(store: Store, manifest: Manifest) -> None:
    """Atomically write ``index.hashes``, ``index.table`` and then ``index.json``, which names the
    table by its sha256 (call this last: ``index.json``'s presence marks a complete dataset)."""
    placeholder = {"url": TABLE_NAME, "num_bytes": 0, "sha256": "0" * 64}
    text = manifest.to_json(table=placeholder)
    # The table records index.json's length, which holds the table's length: a fixed point,
    # reached in a step or two (only the number of digits of the table's length matters).
    size = len(text)
    while True:
        table, hashes = encode_table(manifest.head(), manifest.table, index_bytes=size)
        if len(text) - 1 + len(str(len(table))) == size:
            break
        size = len(text) - 1 + len(str(len(table)))
    ref = json.dumps({"url": TABLE_NAME, "num_bytes": len(table), "sha256": hashlib.sha256(table).hexdigest()},
                     indent=1).replace("\n", "\n ").encode()
    index = text.replace(json.dumps(placeholder, indent=1).replace("\n", "\n ").encode(), ref, 1)
    if len(index) != size:
        raise ManifestError(f"internal: index.json came out {len(index)} bytes, its table says {size}",
                            where=store.path(INDEX_NAME))
    store.write_bytes(HASHES_NAME, hashes)
    store.write_bytes(TABLE_NAME, table)
    store.write_bytes(INDEX_NAME, index)
