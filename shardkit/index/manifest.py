"""``index.json``: the manifest of a packed dataset. Read, validate, write (always last)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import ManifestError
from shardkit.format.bounded import parse_json
from shardkit.format.spec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_NAME,
    SUPPORTED_VERSIONS,
    UNIFORM_NAMES_VERSION,
)
from shardkit.index import _fields
from shardkit.storage import Store

KINDS = ("imagefolder", "coco", "captions")
#: Kinds whose samples have a version of their own, written as ``kind_version`` (docs/concepts/format.md §5):
#: readers refuse a version they do not know. ``captions`` 1: an image, ``txt`` (the caption) and ``json``.
KIND_VERSIONS = {"captions": 1}
#: A shard's ``sha256``: 64 lower-case hex digits. It names the shard's file in a node cache
#: (``<cache_dir>/<sha256>.tar``), so anything else (``"../../x"``, ``"/abs"``) is refused.
SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: The fewest bytes a shard holding ``n`` samples can have: each sample has at least one member,
#: whose tar header alone is one 512-byte block (an upper bound on ``num_samples`` per byte).
_MIN_SAMPLE_BYTES = 512
#: The largest ``index.json`` read: about 1.7 million shards (a shard's entry takes ~150 bytes). A
#: larger file is refused before it is parsed (parsing takes about 10 times its size in memory).
MAX_MANIFEST_BYTES = 256 << 20


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


@dataclass(frozen=True)
class Manifest:
    """The parsed ``index.json`` (format v1; see docs/concepts/format.md for every field).

    Example::

        m = read_manifest(Store("out"))
        m.num_samples, [s.url for s in m.shards]
    """

    kind: str
    shards: tuple[ShardEntry, ...]
    classes: tuple[str, ...] | None = None
    categories: tuple[dict[str, Any], ...] | None = None
    skipped: tuple[dict[str, str], ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Shards written by another tool and indexed in place (``shardkit index``): their samples
    #: need no ``json`` member and may use any image extension (docs/concepts/format.md §8).
    adopted: bool = False

    @property
    def version(self) -> int:
        """The format version these shards follow: 2 with uniform member names, else 1."""
        return (UNIFORM_NAMES_VERSION if self.options.get("uniform_names") is True
                else FORMAT_VERSION)

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)

    def to_json(self) -> bytes:
        """Serialise deterministically (same manifest, same bytes)."""
        doc: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "kind": self.kind,
        }
        if self.kind in KIND_VERSIONS:
            doc["kind_version"] = KIND_VERSIONS[self.kind]
        doc["num_samples"] = self.num_samples
        if self.adopted:
            doc["adopted"] = True
        if self.classes is not None:
            doc["classes"] = list(self.classes)
        if self.categories is not None:
            doc["categories"] = list(self.categories)
        doc.update(self.extra)
        doc["shards"] = [s.to_dict() for s in self.shards]
        doc["skipped"] = list(self.skipped)
        doc["options"] = self.options
        doc["created_by"] = self.created_by
        # backslashreplace: a lone surrogate in a string (COCO json escapes) stays a JSON escape.
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        return text.encode("utf-8", "backslashreplace")

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
        raw = _require(doc, "shards", list, where)
        shards = _shard_entries_fast(raw)
        if shards is None:
            shards = _shard_entries(raw, where)
        manifest = cls(
            kind=kind,
            shards=tuple(shards),
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
    return shards


_BAD_URLS = re.compile(r"(?m)^$|^/|://|(?:^|/)\.\.(?:/|$)|\x00")
_SHA256_LINES = re.compile(r"(?:[0-9a-f]{64}\n)*")


def _shard_entries_fast(raw: list[Any]) -> list[ShardEntry] | None:
    """The shard entries when every one of them is valid, else None (then :func:`_shard_entries`
    finds and names the flaw). Whole-array checks: a million shards validate in about a second."""
    try:
        entries = [ShardEntry(s["url"], s["num_samples"], s["num_bytes"], s["sha256"]) for s in raw]
    except (TypeError, KeyError):
        return None
    urls, shas = [e.url for e in entries], [e.sha256 for e in entries]
    counts, sizes = [e.num_samples for e in entries], [e.num_bytes for e in entries]
    if {type(x) for x in urls} - {str} or {type(x) for x in shas} - {str}:
        return None
    if {type(x) for x in counts} - {int} or {type(x) for x in sizes} - {int}:  # type(): bool is refused
        return None
    joined = "\n".join(urls)
    if joined.count("\n") != len(urls) - 1 or _BAD_URLS.search(joined):
        return None
    if not _SHA256_LINES.fullmatch("".join(f"{h}\n" for h in shas)):
        return None
    if max(sizes, default=0) >= _fields.MAX_INTEGER or max(counts, default=0) >= _fields.MAX_INTEGER:
        return None
    if min(counts, default=0) < 0 or any(n * _MIN_SAMPLE_BYTES > b for n, b in zip(counts, sizes, strict=True)):
        return None
    return entries


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


def read_manifest(store: Store) -> Manifest:
    """Read and validate ``index.json`` from ``store``.

    Raises:
        ManifestError: no index (not a packed dataset, or a pack that did not finish), or an
            invalid one.
    """
    where = store.path(INDEX_NAME)
    if not store.exists(INDEX_NAME):
        if not store.remote and not os.path.isdir(store.path("")):
            what = "is a file, not a dataset directory" if os.path.exists(store.path("")) else "does not exist"
            raise ManifestError(f"{what} (a packed dataset is a directory holding index.json)",
                                where=store.url)
        raise ManifestError(f"no index.json: not a shardkit dataset ({_what_instead(store)})", where=store.url)
    if not store.remote and store.size(INDEX_NAME) > MAX_MANIFEST_BYTES:  # refused unread
        raise ManifestError(f"is larger than {MAX_MANIFEST_BYTES} bytes, the most a manifest may have", where=where)
    return Manifest.from_json(store.read_bytes(INDEX_NAME, limit=MAX_MANIFEST_BYTES + 1), where=where)


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


def write_manifest(store: Store, manifest: Manifest) -> None:
    """Atomically write ``index.json`` (call this last: its presence marks a complete dataset)."""
    store.write_bytes(INDEX_NAME, manifest.to_json())
