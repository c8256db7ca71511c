"""Verify a packed dataset against its manifest: sizes, hashes, counts, member names, decoding."""

from __future__ import annotations

import io
import json
import posixpath
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from shardkit.errors import FormatError, ShardkitError, reraise_interrupt
from shardkit.format.bounded import parse_json, parse_label
from shardkit.format.coco import bbox_malformed, segmentation_malformed
from shardkit.format.crc import crc32
from shardkit.format.dali_index import dali_index_name, dump_dali_index, load_dali_index
from shardkit.format.offsets import REPAIR, load_offsets
from shardkit.format.spec import (
    COMPRESSED_SHARD_SUFFIXES,
    IMAGE_MEMBER_EXTENSIONS,
    INDEX_NAME,
    SHARD_SUFFIX,
    TABLE_NAME,
    check_key,
    offsets_name,
)
from shardkit.format.tarread import TarEntry, iter_entries, sample_key
from shardkit.index._hashing import HashingReader
from shardkit.index.manifest import Manifest, ShardEntry
from shardkit.index.manifest_io import names_table, read_manifest
from shardkit.index.member_checks import not_as_named
from shardkit.storage import Store


@dataclass
class VerifyReport:
    """Result of :func:`verify_dataset`: ``problems`` is empty when everything matches."""

    manifest: Manifest
    shards_checked: int = 0
    samples_checked: int = 0
    images_decoded: int = 0
    problems: list[str] = field(default_factory=list)
    #: Shards with no offsets file beside them (allowed: the loader then finds their samples by
    #: reading the shard, and checks none against a CRC-32).
    unindexed: list[str] = field(default_factory=list)
    #: COCO samples with a malformed segmentation, flagged by the pack and kept (allowed: a
    #: loader with ``masks=True`` replaces those images with others, one without reads them).
    flagged: list[str] = field(default_factory=list)
    #: Tar files beside the shards that ``index.json`` does not name (allowed: no loader reads
    #: them; a shard copied in, or left from another pack, that the user may have meant to add).
    unlisted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _source_of(fields: dict[str, bytes]) -> str:
    """``"; packed from <file>"`` where a sample's ``json`` member names its source file (a pack
    of shardkit's records it), else ``""``."""
    try:
        source = json.loads(fields["json"]).get("source")
    except (KeyError, ValueError, AttributeError):
        return ""
    return f"; packed from {source}" if isinstance(source, str) else ""


def _decodes(data: bytes) -> str | None:
    """Why ``data`` does not decode as an image, or None. PIL's words for bytes that are no image
    (``cannot identify image file <_io.BytesIO object at 0x7f…>``) become what the bytes start with."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:
                img.convert("RGB")
    except UnidentifiedImageError:
        if not data:
            return "empty (0 bytes)"
        return f"not an image file PIL can identify (no image format's, or a damaged header); its first bytes are " \
               f"{data[:12]!r}"
    except Exception as err:  # any decoder failure is a finding, not a crash
        reraise_interrupt(err)  # unless it is Ctrl-C, wrapped
        return f"{type(err).__name__}: {_OBJECT_REPR.sub('', str(err))}"
    return None


#: An object's default repr (``<_io.BytesIO object at 0x7f…>``), which some of PIL's errors name.
_OBJECT_REPR = re.compile(r"\s*<[^<>]* object at 0x[0-9a-f]+>")


def _samples_with_spans(f: io.BufferedReader, where: str,
                        members: list[TarEntry]) -> Iterator[tuple[str, dict[str, bytes], int, int]]:
    """Like :func:`~shardkit.format.tarread.iter_samples`, plus each sample's ``(offset, size)``
    span in the shard (what its offsets-file line must say); every member (without its data) is
    appended to ``members`` (what a DALI index must list)."""
    seen: set[str] = set()
    key: str | None = None
    fields: dict[str, bytes] = {}
    start = end = 0
    for entry in iter_entries(f, where=where):
        members.append(entry._replace(data=None))
        member_key, ext = sample_key(entry.name, where=where)
        if member_key != key:
            if key is not None:
                yield key, fields, start, end - start
            if member_key in seen:
                raise FormatError(f"sample {member_key!r} is split across the shard", where=where)
            seen.add(member_key)
            key, fields, start = member_key, {}, entry.offset
        if ext in fields:
            raise FormatError(f"sample {member_key!r} has field {ext!r} twice", where=where)
        fields[ext] = entry.data or b""
        end = entry.end
    if key is not None:
        yield key, fields, start, end - start


def _check_offsets(store: Store, entry: ShardEntry, spans: list[tuple[str, int, int]], report: VerifyReport) -> None:
    """Compare the shard's offsets file, line by line, with the spans found in the shard."""
    idx = offsets_name(entry.url)
    if not store.exists(idx):
        report.unindexed.append(store.path(entry.url))
        return
    try:
        listed = [(s.key, s.offset, s.size) for s in load_offsets(store.read_bytes(idx), where=store.path(idx))]
    except FormatError as err:
        raise FormatError(f"{err.message}; {REPAIR}", where=err.where) from err
    for number, (said, real) in enumerate(zip(listed, spans, strict=False), start=2):
        if said != real:
            report.problems.append(f"{store.path(idx)}: line {number} says {' '.join(map(str, said))}, the shard "
                                   f"has {' '.join(map(str, real))} (the loader would read the wrong bytes)")
            return
    if len(listed) != len(spans):
        report.problems.append(f"{store.path(idx)}: lists {len(listed)} samples, the shard has {len(spans)}")


def _check_shard(store: Store, entry: ShardEntry, manifest: Manifest, keys: set[str],
                 report: VerifyReport, decode: bool) -> None:
    where = store.path(entry.url)
    found: list[str] = []
    spans: list[tuple[str, int, int]] = []
    members: list[TarEntry] = []
    with store.open_read(entry.url) as f:
        reader = HashingReader(f)
        for key, fields, offset, size in _samples_with_spans(io.BufferedReader(reader, 1 << 20), where, members):
            here = f"{where}:{key}"
            found.append(key)
            spans.append((key, offset, size))
            try:
                check_key(key, where=where)
            except FormatError as err:
                report.problems.append(str(err))
            if key in keys:
                report.problems.append(f"{here}: key appears more than once in the dataset")
            keys.add(key)
            images = [e for e in fields if e in IMAGE_MEMBER_EXTENSIONS]
            if len(images) != 1:
                report.problems.append(f"{here}: expected one image member, found {sorted(fields)}")
            elif not decode and (odd := not_as_named(images[0], fields[images[0]])) is not None and not odd[0]:
                report.problems.append(f"{here}.{images[0]}: {odd[1]}: no image the loader decodes")
            elif decode:
                error = _decodes(fields[images[0]])
                report.images_decoded += error is None
                if error:
                    source = "" if manifest.adopted else _source_of(fields)  # another tool's json is not ours
                    report.problems.append(f"{here}.{images[0]}: does not decode ({error}){source}")
            if manifest.kind == "imagefolder":
                _check_label(fields, manifest, here, report)
            elif manifest.kind == "coco":
                _check_coco(fields, manifest, here, report)
            elif manifest.kind == "captions":
                _check_caption(fields, manifest, here, report)
        while reader.read(1 << 20):  # hash the trailing padding too
            pass
    report.samples_checked += len(found)
    if reader.count != entry.num_bytes:
        report.problems.append(f"{where}: {reader.count} bytes, manifest says {entry.num_bytes}")
    if reader.hash.hexdigest() != entry.sha256:
        report.problems.append(f"{where}: sha256 differs from the manifest")
        report.problems.extend(_changed_samples(store, entry))
    if len(found) != entry.num_samples:
        report.problems.append(f"{where}: {len(found)} samples, manifest says {entry.num_samples}")
    _check_offsets(store, entry, spans, report)
    _check_dali_index(store, entry, members, report)


def _check_dali_index(store: Store, entry: ShardEntry, members: list[TarEntry], report: VerifyReport) -> None:
    """Compare the shard's DALI index, when it has one, with what its members say it must list:
    DALI reads a member's bytes at the offset and size its index gives, so a damaged index makes
    it fail or, worse, hand one sample's image to another."""
    name = dali_index_name(entry.url)
    raw = store.read_optional(name)
    if raw is None:
        return
    where = store.path(name)
    try:
        listed = load_dali_index(raw, where=where)
        actual = load_dali_index(dump_dali_index(members, where=store.path(entry.url)), where=where)
    except FormatError as err:
        report.problems.append(str(err))
        return
    for number, (said, real) in enumerate(zip(listed, actual, strict=False), start=2):
        if said != real:
            shown = " ".join(f"{m.ext} {m.offset} {m.size} {m.name}" for m in said)[:200]
            truth = " ".join(f"{m.ext} {m.offset} {m.size} {m.name}" for m in real)[:200]
            report.problems.append(f"{where}: line {number} says {shown}, the shard has {truth} (DALI would read the "
                                   "wrong bytes)")
            return
    if len(listed) != len(actual):
        report.problems.append(f"{where}: lists {len(listed)} samples, the shard has {len(actual)}")


#: Samples named one by one when a shard's bytes changed; the rest are counted.
NAMED_CHANGES = 10


def _changed_samples(store: Store, entry: ShardEntry) -> list[str]:
    """Which samples of a shard whose sha256 differs changed after packing, by the CRC-32 of each
    sample in its offsets file (version 2; nothing for version 1 or no offsets file)."""
    idx = offsets_name(entry.url)
    try:
        listed = load_offsets(store.read_bytes(idx), where=store.path(idx)) if store.exists(idx) else []
    except FormatError:
        return []  # reported by _check_offsets
    where, changed = store.path(entry.url), []
    with store.open_read(entry.url) as f:
        for span in listed:
            if span.crc32 is None:
                return []
            f.seek(span.offset)
            if crc32(f.read(span.size)) != span.crc32:
                changed.append(span.key)
    out = [f"{where}:{key}: its bytes changed after packing or indexing (crc32 differs from the offsets file)"
           for key in changed[:NAMED_CHANGES]]
    if len(changed) > NAMED_CHANGES:
        out.append(f"{where}: and {len(changed) - NAMED_CHANGES} more samples whose bytes changed")
    return out


def _check_label(fields: dict[str, bytes], manifest: Manifest, here: str,
                 report: VerifyReport) -> None:
    # Adopted shards (written by another tool) need no json member; when one is there, only the
    # fields it has are checked against cls and the class list.
    try:
        label = parse_label(fields["cls"])
        meta = parse_json(fields["json"]) if "json" in fields or not manifest.adopted else {}
    except (KeyError, ValueError) as err:
        report.problems.append(f"{here}: missing or malformed cls/json member ({err})")
        return
    if not isinstance(meta, dict):
        report.problems.append(f"{here}.json: must be a JSON object, not {type(meta).__name__}")
        return
    classes = manifest.classes or ()
    if manifest.adopted:
        agrees = 0 <= label < len(classes) and meta.get("label", label) == label and (
            "class" not in meta or meta["class"] == classes[label])
    else:
        agrees = (0 <= label < len(classes) and meta.get("label") == label
                  and meta.get("class") == classes[label])
    if not agrees:
        report.problems.append(f"{here}: label {label} disagrees with json or the class list")


def _check_coco(fields: dict[str, bytes], manifest: Manifest, here: str,
                report: VerifyReport) -> None:
    try:
        meta = parse_json(fields["json"])
    except (KeyError, ValueError) as err:
        report.problems.append(f"{here}: missing or malformed json member ({err})")
        return
    meta = meta if isinstance(meta, dict) else {}
    image, anns = meta.get("image"), meta.get("annotations")
    if ("cls" in fields or not isinstance(image, dict) or not isinstance(anns, list)
        or meta.get("source") != image.get("file_name")):
        report.problems.append(f"{here}: json is not {{image, annotations, source}} of one COCO "
                               "image (or a cls member is present)")
        return
    categories = {c.get("id") for c in manifest.categories or ()}
    if any(not isinstance(a, dict) or a.get("image_id") != image.get("id")
           or a.get("category_id") not in categories for a in anns):
        report.problems.append(f"{here}: an annotation belongs to another image or to an unknown "
                               "category")
        return
    size: list[object] = []  # the image's (width, height), read from its header once needed
    for ann in anns:
        if bbox_malformed(ann.get("bbox")):
            report.problems.append(f"{here}: annotation {ann.get('id')!r}: bbox is not 4 numbers "
                                   f"({ann.get('bbox')!r:.60}): the loader replaces this image with another")
        elif "segmentation" in ann:
            seg = ann["segmentation"]
            if isinstance(seg, dict) and not size:  # an RLE is checked against the image the loader
                size.extend(_image_size(fields))    # decodes, whatever size the record says
            if segmentation_malformed(seg, *(size if isinstance(seg, dict) else (None, None))):
                report.flagged.append(f"{here}: annotation {ann.get('id')!r}")


def _image_size(fields: dict[str, bytes]) -> tuple[object, object]:
    """``(width, height)`` of the sample's image member from its header; ``(None, None)`` when
    there is no one image member or its header cannot be read (the checks that need it are left out)."""
    from PIL import Image

    images = [e for e in fields if e in IMAGE_MEMBER_EXTENSIONS]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(fields[images[0]])) as img:
                return img.size
    except Exception as err:  # a member that is no image is reported by the image checks
        reraise_interrupt(err)
        return None, None


def _check_caption(fields: dict[str, bytes], manifest: Manifest, here: str, report: VerifyReport) -> None:
    """A captioned sample: a ``txt`` member of UTF-8 text; a ``json`` object (required unless adopted)."""
    if "txt" not in fields:
        report.problems.append(f"{here}: no txt member (the caption)")
    else:
        try:
            fields["txt"].decode("utf-8")
        except UnicodeDecodeError as err:
            report.problems.append(f"{here}.txt: caption is not UTF-8 ({err.reason} at byte {err.start})")
    if "json" not in fields:
        if not manifest.adopted:
            report.problems.append(f"{here}: no json member")
        return
    try:
        meta = parse_json(fields["json"])
    except ValueError as err:
        report.problems.append(f"{here}.json: not valid JSON ({err})")
        return
    if not isinstance(meta, dict):
        report.problems.append(f"{here}.json: not a JSON object")


def _check_table(store: Store, manifest: Manifest, report: VerifyReport) -> None:
    """The shard table, when ``index.json`` names one, must hold what ``index.json`` holds."""
    if not names_table(store):
        return
    try:
        table = read_manifest(store, strict_table=True)
        table.table.hashes()  # every block of index.hashes, each checked against the table
    except ShardkitError as err:
        report.problems.append(str(err))
        return
    if table != manifest or table.head() != manifest.head():
        report.problems.append(f"{store.path(TABLE_NAME)}: holds other shards or fields than index.json (write it "
                               f"again: `shardkit index --table {store.url}`)")


def verify_dataset(
    url: str,
    *,
    decode: bool = False,
    storage_options: dict[str, object] | None = None,
    progress: Callable[[ShardEntry], None] | None = None,
) -> VerifyReport:
    """Re-read every shard of the dataset at ``url`` and compare it with ``index.json``.

    Checks each shard's size, sha256, sample count, member names and key uniqueness, labels
    against the class list (COCO: records and category ids in ``json``), offsets files, DALI
    index files (``<shard>.dali.idx``, when present), the shard table (``index.table`` and
    ``index.hashes``, when ``index.json`` names them) against ``index.json``, and
    with ``decode=True`` that every image decodes; lists the tar files beside the shards that
    ``index.json`` does not name.
    Problems are collected, not raised, so one run lists them all.

    Raises:
        ManifestError: the manifest itself is missing or invalid.
    """
    store = Store(url, storage_options)
    manifest = read_manifest(store, table=False)
    report = VerifyReport(manifest)
    if not manifest.shards or not manifest.num_samples:
        report.problems.append(f"{store.path(INDEX_NAME)}: lists no sample: a dataset with nothing to load")
    _check_table(store, manifest, report)
    keys: set[str] = set()
    for entry in manifest.shards:
        try:
            _check_shard(store, entry, manifest, keys, report, decode)
        except ShardkitError as err:
            report.problems.append(_unreadable(store, entry, err, adopted=manifest.adopted))
        report.shards_checked += 1
        if progress:
            progress(entry)
    report.unlisted = _unlisted(store, manifest)
    return report


def _unreadable(store: Store, entry: ShardEntry, err: ShardkitError, *, adopted: bool = False) -> str:
    """Why ``entry``'s shard could not be read through: a tar that ended early in a shard shorter
    than the manifest says is said as cut short (the tar's own hint, to append an end marker,
    would make a damaged shard look whole), anything else as ``err`` says it."""
    if not isinstance(err, FormatError):
        return str(err)  # not a tar's fault: a FIFO, a device, a read error
    try:
        size = store.size(entry.url)
    except ShardkitError:
        return str(err)
    if size >= entry.num_bytes:
        return str(err)
    where_from = "it was written" if adopted else "it was packed"
    return (f"{store.path(entry.url)}: {size:,} bytes, {INDEX_NAME} says {entry.num_bytes:,} (cut short): copy it "
            f"again from where {where_from}, or {'index' if adopted else 'pack'} the dataset again")


def _unlisted(store: Store, manifest: Manifest) -> list[str]:
    """The ``.tar`` files directly in the dataset's folder that ``index.json`` does not name, and
    compressed or ``.TAR`` ones (hidden ones, such as macOS's ``._`` files, left out, as ``shardkit
    index`` leaves them); none where the folder cannot be listed (a bucket read without the right
    to list it)."""
    named = {posixpath.normpath(entry.url) for entry in manifest.shards}
    try:
        names = store.listdir()
    except ShardkitError:
        return []
    return [store.path(name) for name in names
            if name.lower().endswith((SHARD_SUFFIX, *COMPRESSED_SHARD_SUFFIXES)) and not name.startswith(".")
            and name not in named]
