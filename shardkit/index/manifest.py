"""``index.json``: the manifest of a packed dataset. Parse, validate, serialise.

Finding a dataset, reading its manifest and writing one (always last):
:mod:`shardkit.index.manifest_io`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from shardkit.errors import ManifestError
from shardkit.format.bounded import parse_json
from shardkit.format.spec import FORMAT_NAME, FORMAT_VERSION, SUPPORTED_VERSIONS, UNIFORM_NAMES_VERSION
from shardkit.index import _fields
from shardkit.index._shard_list import hex_hashes, shard_table
from shardkit.index.shards import ShardEntry, ShardTable

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
        ``index.table`` written right after ``num_samples`` (see :func:`~shardkit.index.manifest_io.write_manifest`)."""
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
            what = "no \"kind\"" if kind is None else f"unknown kind {kind!r}"
            raise ManifestError(f"{what} (expected one of {', '.join(KINDS)})", where=where)
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
