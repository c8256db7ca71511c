"""``index.json``: the manifest of a packed dataset. Read, validate, write (always last)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from shardkit.errors import ManifestError, StorageError
from shardkit.format.bounded import parse_json
from shardkit.format.spec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    HASHES_NAME,
    INDEX_NAME,
    SUPPORTED_VERSIONS,
    TABLE_NAME,
    UNIFORM_NAMES_VERSION,
)
from shardkit.index import _fields
from shardkit.index._shard_list import SHA256_RE, hex_hashes, shard_table
from shardkit.index.shards import ShardEntry, ShardTable
from shardkit.index.table import decode_table, encode_table
from shardkit.storage import Store
from shardkit.storage.copies import cached_copy

KINDS = ("imagefolder", "coco", "captions")
#: Kinds whose samples have a version of their own, written as ``kind_version`` (docs/concepts/format.md §5):
#: readers refuse a version they do not know. ``captions`` 1: an image, ``txt`` (the caption) and ``json``.
KIND_VERSIONS = {"captions": 1}
#: The largest ``index.json`` read: about 1.7 million shards (a shard's entry takes ~150 bytes). A
#: larger file is refused before it is parsed (parsing takes about 10 times its size in memory).
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class Manifest:
    """The parsed ``index.json`` (format v1; see docs/concepts/format.md for every field).

    ``shards`` may be given as any sequence of :class:`ShardEntry`; it is held as a
    :class:`~shardkit.index.shards.ShardTable` (:attr:`table`), by column.

    Example::

        m = read_manifest(Store("out"))
        m.num_samples, [s.url for s in m.shards], m.table.num_samples
    """

    kind: str
    shards: Sequence[ShardEntry]
    classes: tuple[str, ...] | None = None
    categories: tuple[dict[str, Any], ...] | None = None
    skipped: tuple[dict[str, str], ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Shards written by another tool and indexed in place (``shardkit index``): their samples
    #: need no ``json`` member and may use any image extension (docs/concepts/format.md §8).
    adopted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.shards, ShardTable):
            object.__setattr__(self, "shards", ShardTable.from_entries(tuple(self.shards)))

    @property
    def table(self) -> ShardTable:
        """The shards by column: counts and sizes as int64 arrays, hashes fetched when asked for."""
        return cast(ShardTable, self.shards)

    @property
    def version(self) -> int:
        """The format version these shards follow: 2 with uniform member names, else 1."""
        return (UNIFORM_NAMES_VERSION if self.options.get("uniform_names") is True
                else FORMAT_VERSION)

    @property
    def num_samples(self) -> int:
        return int(self.table.num_samples.sum())

    @property
    def num_bytes(self) -> int:
        return int(self.table.num_bytes.sum())

    def to_json(self, *, table: dict[str, Any] | None = None) -> bytes:
        """Serialise deterministically (same manifest, same bytes). ``table``: the reference to
        ``index.table`` written right after ``num_samples`` (see :func:`write_manifest`)."""
        doc = self._doc(table)
        shards = self.table
        doc["shards"] = [{"url": u, "num_samples": n, "num_bytes": b, "sha256": h} for u, n, b, h in zip(
            shards.urls, shards.num_samples.tolist(), shards.num_bytes.tolist(),
            hex_hashes(shards.hashes()), strict=True)]
        doc.update(self._tail())
        # backslashreplace: a lone surrogate in a string (COCO json escapes) stays a JSON escape.
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        return text.encode("utf-8", "backslashreplace")

    def head(self) -> dict[str, Any]:
        """Every field of ``index.json`` but ``shards`` (what ``index.table`` keeps as JSON)."""
        return {**self._doc(None), **self._tail()}

    def _doc(self, table: dict[str, Any] | None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "kind": self.kind,
        }
        if self.kind in KIND_VERSIONS:
            doc["kind_version"] = KIND_VERSIONS[self.kind]
        doc["num_samples"] = self.num_samples
        if table is not None:
            doc["table"] = table
        if self.adopted:
            doc["adopted"] = True
        if self.classes is not None:
            doc["classes"] = list(self.classes)
        if self.categories is not None:
            doc["categories"] = list(self.categories)
        doc.update(self.extra)
        return doc

    def _tail(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped), "options": self.options, "created_by": self.created_by}

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> Manifest:
        """Parse and validate; raise ``ManifestError`` naming ``where`` and the bad field."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"is larger than {MAX_MANIFEST_BYTES} bytes, the most a manifest may have",
                                where=where)
        try:  # nesting bounded by the parser's own limit (a depth scan would double a large index's load time)
            doc = parse_json(data, max_depth=None)
        except ValueError as err:  # also: not UTF-8, a number of more digits than Python converts
            raise ManifestError(f"not valid JSON ({err})", where=where) from err
        cls._check_format(doc, where)
        return cls.from_head(doc, shard_table(_require(doc, "shards", list, where), where), where=where)

    @staticmethod
    def _check_format(doc: Any, where: str) -> None:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise ManifestError(f"not a shardkit manifest (missing \"format\": \"{FORMAT_NAME}\")",
                                where=where)
        version = doc.get("version")
        if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
            readable = " and ".join(map(str, SUPPORTED_VERSIONS))
            raise ManifestError(
                f"format version {version!r} is not supported (this shardkit reads versions "
                f"{readable})",
                where=where,
            )
        kind = doc.get("kind")
        if kind not in KINDS:
            raise ManifestError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})",
                                where=where)
        if kind in KIND_VERSIONS or "kind_version" in doc:
            _check_kind_version(kind, doc.get("kind_version"), where)

    @classmethod
    def from_head(cls, doc: dict[str, Any], shards: ShardTable, *, where: str) -> Manifest:
        """The manifest of ``shards`` and ``doc``, the other fields of ``index.json``, validated
        as :meth:`from_json` validates them."""
        cls._check_format(doc, where)
        version, kind = doc["version"], doc["kind"]
        manifest = cls(
            kind=kind,
            shards=shards,
            classes=_fields.string_list(doc["classes"], "classes", where) if "classes" in doc
            else None,
            categories=_fields.object_list(doc["categories"], "categories", where)
            if "categories" in doc else None,
            skipped=_fields.skipped_list(doc.get("skipped", []), "skipped", where),
            options=dict(_fields.obj(doc.get("options", {}), "options", where)),
            created_by=_fields.string(doc.get("created_by", ""), "created_by", where),
            extra={k: doc[k] for k in ("info", "licenses", "annotation_report", "drop_empty") if k in doc},
            adopted=_flag(doc.get("adopted", False), "adopted", where),
        )
        if "annotation_report" in doc:
            _fields.obj(doc["annotation_report"], "annotation_report", where)
        if "num_samples" not in doc:
            raise ManifestError("missing field 'num_samples'", where=where)
        if _fields.integer(doc["num_samples"], "num_samples", where) != manifest.num_samples:
            raise ManifestError(
                f"num_samples {doc['num_samples']} differs from the sum over shards "
                f"({manifest.num_samples})",
                where=where,
            )
        if manifest.version != version:
            raise ManifestError(f"version {version} disagrees with options.uniform_names (version "
                                f"{UNIFORM_NAMES_VERSION} means uniform member names)", where=where)
        if kind == "imagefolder" and manifest.classes is None:
            raise ManifestError("an imagefolder manifest needs \"classes\"", where=where)
        return manifest


def _check_kind_version(kind: str, version: Any, where: str) -> None:
    """Refuse a ``kind_version`` this shardkit does not know for ``kind`` (or one missing)."""
    known = KIND_VERSIONS.get(kind)
    if known is None:
        raise ManifestError(f"kind {kind!r} has no kind_version (found {version!r:.40})", where=where)
    if isinstance(version, bool) or version != known:
        raise ManifestError(f"{kind} samples of kind_version {version!r:.40} are not supported (this shardkit reads "
                            f"kind_version {known})", where=where)


def _flag(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ManifestError(f"field {key!r} must be true or false", where=where)
    return value


def _require(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise ManifestError(f"missing field {key!r}", where=where)
    if not isinstance(doc[key], kind):
        raise ManifestError(f"field {key!r} must be {kind.__name__}", where=where)
    return doc[key]


def locate_dataset(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """The store holding a dataset given as a directory, URL prefix or ``.../index.json``."""
    base = (url[: -len(INDEX_NAME)].rstrip("/") if url.rstrip("/").endswith("/" + INDEX_NAME)
            or url == INDEX_NAME else url)
    return Store(base or ".", storage_options)


#: Bytes read first from ``index.json``: enough for the fields before ``table`` as shardkit writes them.
_HEAD_BYTES = 4096
_TABLE_REF = re.compile(rb'\A\{\s*"format":\s*"shardkit",\s*"version":\s*(\d{1,9}),\s*"kind":\s*"([a-z]{1,32})",'
                        rb'\s*"num_samples":\s*(\d{1,20}),\s*"table":\s*')


def read_manifest(store: Store, *, cache_dir: str | None = None, table: bool = True) -> Manifest:
    """Read and validate the manifest of the dataset in ``store``.

    When ``index.json`` names an ``index.table`` (docs/concepts/format.md §10), only its first
    bytes are read and the manifest comes from the table, which must have the sha256 that
    ``index.json`` gives it (its shards' hashes are read by block when asked for); else, or with
    ``table=False``, from ``index.json`` in full. ``cache_dir``: a remote dataset's table is
    fetched once into this directory and shared by the node's processes
    (:func:`~shardkit.storage.copies.cached_copy`).

    Raises:
        ManifestError: no index (not a packed dataset, or a pack that did not finish), an
            invalid one, or a table that is missing, stale (another sha256 than ``index.json``
            names) or invalid, naming the file.
    """
    where = store.path(INDEX_NAME)
    head = _read_head(store) if table else None
    ref = _table_ref(head, where) if head is not None else None
    if ref is not None:
        return _read_table(store, ref, cache_dir)
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


def _no_index(store: Store) -> None:
    if not store.remote and not os.path.isdir(store.path("")):
        what = "is a file, not a dataset directory" if os.path.exists(store.path("")) else "does not exist"
        raise ManifestError(f"{what} (a packed dataset is a directory holding index.json)", where=store.url)
    raise ManifestError(f"no index.json: not a shardkit dataset ({_what_instead(store)})", where=store.url)


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
    version, kind, num_samples = int(found[1]), found[2].decode(), int(found[3])
    Manifest._check_format({"format": FORMAT_NAME, "version": version, "kind": kind}, where)
    return {**ref, "version": version, "kind": kind, "num_samples": num_samples}


def _read_table(store: Store, ref: dict[str, Any], cache_dir: str | None) -> Manifest:
    where = store.path(TABLE_NAME)

    def fetch() -> bytes:
        try:
            data = store.read_bytes(TABLE_NAME, limit=ref["num_bytes"] + 1)
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):
                raise ManifestError(f"missing, though {INDEX_NAME} names it (copy it with the dataset, or write it "
                                    f"again: `shardkit index --table {store.url}`)", where=where) from err
            raise
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != ref["num_bytes"] or digest != ref["sha256"]:
            raise ManifestError(f"stale or damaged: {len(data)}{'+' if len(data) > ref['num_bytes'] else ''} bytes "
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
            if key == "index_bytes":  # rewritten, or cut short / damaged: say the latter where it is so
                Manifest.from_json(store.read_bytes(INDEX_NAME, limit=MAX_MANIFEST_BYTES + 1),
                                   where=store.path(INDEX_NAME))
            what = key.replace("_", " ")
            raise ManifestError(f"stale: it was written with a {INDEX_NAME} whose {what} is {value!r}, this one's is "
                                f"{ref[key]!r} (write it again: `shardkit index --table {store.url}`)",
                                where=where)
    return Manifest.from_head(doc, shards, where=where)


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
