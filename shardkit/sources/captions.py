"""Captioned image folders: images with a ``.txt`` caption (and optional ``.json``) beside each.

The layout img2dataset writes with ``output_format="files"`` (``00000/000000000.jpg``, ``.txt``,
``.json``), or any tree of images with sidecars. Samples are the image files under the root
(torchvision's image extensions, case-insensitive), recursively, in ``sorted(os.walk(...))`` order
(directory by directory, names sorted; links followed), the order an ImageFolder tree of the same
files has. Each image ``dir/name.ext`` takes its caption from ``dir/name.txt`` (UTF-8; one
trailing newline removed) and extra fields from ``dir/name.json`` (a JSON object) when present.

An image without a readable caption (no ``.txt``, not UTF-8) or with a ``.json`` that is not a
JSON object is not packed: it is listed in ``warnings`` with the reason, and counts as a skipped
input. Sidecars are read while listing (they are small), with the source's own reader, so a
bucket folder is read with bounded concurrency and a change to a caption changes the pack's
fingerprint.
"""

from __future__ import annotations

import json
import logging
import posixpath
from typing import Any

from shardkit.errors import SourceError
from shardkit.format.bounded import parse_json
from shardkit.format.spec import IMAGE_EXTENSIONS
from shardkit.sources.base import SourceListing, SourceSample, source_name
from shardkit.sources.files import FileEntry, SkipSample
from shardkit.sources.open import open_files

__all__ = ["CAPTIONS_KIND", "caption_text", "check_extra", "scan_caption_folder"]

#: The sample kind of captioned images in ``index.json`` (docs/concepts/format.md §5).
CAPTIONS_KIND = "captions"
_SUFFIXES = tuple("." + e for e in IMAGE_EXTENSIONS)

log = logging.getLogger("shardkit.pack.sources")


def caption_text(raw: bytes) -> str:
    """A caption file's text: UTF-8, one trailing newline (``\\n`` or ``\\r\\n``) removed.

    >>> caption_text(b"a dog on a beach\\n")
    'a dog on a beach'

    Raises:
        SkipSample: the bytes are not UTF-8, or hold no text (empty, or only white space).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SkipSample(f"caption is not UTF-8 text ({err.reason} at byte {err.start})") from err
    if not text.strip():
        raise SkipSample("empty caption (no text, or only white space)")
    return text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text


def check_extra(value: Any) -> dict[str, Any]:
    """A sidecar ``.json``'s content as extra fields: a JSON object (raises :class:`SkipSample`)."""
    try:
        doc = parse_json(value)
    except ValueError as err:
        raise SkipSample(f"sidecar .json is not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise SkipSample(f"sidecar .json must hold a JSON object, not {type(doc).__name__}")
    return doc


def scan_caption_folder(root: str, *, storage_options: dict[str, Any] | None = None) -> SourceListing:
    """List the captioned images under ``root`` (a directory or fsspec URL prefix).

    Example::

        listing = scan_caption_folder("laion_part/")
        listing.samples[0].caption, listing.samples[0].meta  # 'a red car', {'url': ...}

    Raises:
        SourceError: ``root`` is not a directory, or holds no image file.
        StorageError: a URL ``root`` cannot be listed or read.
    """
    files = open_files(root, storage_options)
    if not files.is_dir():
        raise SourceError("source directory does not exist or is not a directory", where=files.root)
    [entries] = files.walk([""])
    for e in entries:
        if e.problem and e.rel in ("", "."):  # the folder itself
            raise SourceError(e.problem, where=files.root)
    warnings: list[dict[str, str]] = [{"source": source_name(e.rel), "reason": e.problem}
                                      for e in entries if e.problem]
    entries = [e for e in entries if not e.problem]
    by_rel = {e.rel: e for e in entries}
    images = [e for e in entries if e.rel.lower().endswith(_SUFFIXES)]
    if not images:
        raise SourceError("no image files here: a captioned folder holds images (jpg, png, ...) with a .txt "
                          "caption beside each", where=files.root)
    stems = {posixpath.splitext(image.rel)[0] for image in images}
    folders = {posixpath.dirname(image.rel) for image in images}
    orphans = sorted(e.rel for e in entries if e.rel.endswith(".txt") and e.rel[:-4] not in stems
                     and posixpath.dirname(e.rel) in folders and e.rel[:-4] + ".json" in by_rel)
    if orphans:  # a sample's text and json with its image of a format not packed (.gif, .avif), or gone
        log.warning("shardkit: %d caption%s with no image beside %s (a .txt and a .json, no image of a format "
                    "packed), not packed: %s%s", len(orphans), "s" if len(orphans) > 1 else "",
                    "them" if len(orphans) > 1 else "it", ", ".join(source_name(r) for r in orphans[:3]),
                    ", ..." if len(orphans) > 3 else "")
    wanted: list[tuple[FileEntry, FileEntry, FileEntry | None]] = []
    for image in images:
        stem = posixpath.splitext(image.rel)[0]
        txt = by_rel.get(f"{stem}.txt")
        if txt is None:
            warnings.append({"source": source_name(image.rel),
                             "reason": f"no caption ({source_name(stem)}.txt does not exist)"})
            continue
        wanted.append((image, txt, by_rel.get(f"{stem}.json")))
    sidecars = [SourceSample(e.path, source_name(e.rel), e.size, version=e.version)
                for _, txt, extra in wanted for e in (txt, extra) if e is not None]
    read = dict(zip((s.rel for s in sidecars), files.read_each(sidecars), strict=True))
    samples = []
    for image, txt, extra in wanted:
        rel = source_name(image.rel)
        try:
            caption = caption_text(_content(read[source_name(txt.rel)], "caption .txt"))
            meta = check_extra(_content(read[source_name(extra.rel)], "sidecar .json")) if extra else {}
        except SkipSample as skip:
            warnings.append({"source": rel, "reason": skip.reason})
            continue
        version = json.dumps([image.version, txt.version, extra.version if extra else ""])
        samples.append(SourceSample(image.path, rel, image.size, meta=meta, version=version, caption=caption))
    return SourceListing(kind=CAPTIONS_KIND, root=files.root, samples=samples, warnings=warnings, files=files)


def _content(got: bytes | SkipSample, what: str) -> bytes:
    """A sidecar's bytes; an empty ``.txt`` is an empty caption, an unreadable one a skip."""
    if isinstance(got, SkipSample):
        if got.reason.startswith("empty file"):
            return b""
        raise SkipSample(f"{what} {got.reason}")
    return got
