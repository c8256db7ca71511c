"""What ``shardkit index`` judges of adopted samples without decoding them: image members whose
first bytes are no image format's or another format's than their extension says, and labels that
imply a class list mostly unused (a mistyped label).

Members that are odd are indexed all the same and said once at the end (:class:`Oddities`); labels
that leave most of the class list unused are refused (:func:`check_unused_run`).
"""

from __future__ import annotations

import logging
from collections import Counter

from shardkit.errors import FormatError

__all__ = ["UNUSED_RUN_CLASSES", "UNUSED_RUN_LEAST", "UNUSED_RUN_PER_LABEL", "Oddities", "check_unused_run",
           "format_of", "not_as_named"]

log = logging.getLogger("shardkit.index")

#: ``shardkit index`` refuses labels that imply a class list longer than :data:`UNUSED_RUN_CLASSES`
#: (well past the largest label spaces in use: ImageNet-21k's 21,841, Open Images' ~20k) and leave at
#: least :data:`UNUSED_RUN_LEAST` unused in one run, more than half the list and more than
#: :data:`UNUSED_RUN_PER_LABEL` times the labels in use (a mistyped label).
UNUSED_RUN_CLASSES = 100_000
UNUSED_RUN_LEAST = 10_000
UNUSED_RUN_PER_LABEL = 100


class Oddities:
    """What is indexed all the same but said once at the end (:meth:`say`): captions that are not
    UTF-8 text (``not_text``), image members that are empty or no image format's (``not_image``),
    and images of another format than their extension says (``misnamed``); each counted, with the
    first named."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {"not_text": 0, "empty_text": 0, "not_image": 0, "misnamed": 0}
        self.first: dict[str, str] = {}
        #: image members per extension (``jpg``, ``png``, …): a set of several loses samples in
        #: readers that take their columns from the first samples
        self.image_names: Counter[str] = Counter()

    def add(self, kind: str, what: str) -> None:
        """One more of ``kind``; ``what`` names it (the first one is kept)."""
        self.count[kind] += 1
        self.first.setdefault(kind, what)

    def say(self) -> None:
        """One warning per kind found."""
        def more(n: int) -> str:
            return f", and {n - 1:,} more" if n > 1 else ""

        n = self.count["not_text"]
        if n:
            log.warning("shardkit: %s %s not UTF-8 text (%s%s); indexed all the same: the loader replaces such "
                        "samples with others (on_error='replace'), and shardkit verify reports them as problems",
                        f"{n:,}", "caption is" if n == 1 else "captions are", self.first["not_text"], more(n))
        n = self.count["empty_text"]
        if n:
            log.warning("shardkit: %s %s empty (%s%s); indexed all the same: the loader delivers %s as '' (shardkit "
                        "pack skips an input without a caption)", f"{n:,}", "caption is" if n == 1 else "captions are",
                        self.first["empty_text"], more(n), "it" if n == 1 else "them")
        n = self.count["not_image"]
        if n:
            log.warning("shardkit: %s %s no image (%s%s); indexed all the same: the loader replaces such samples "
                        "with others (on_error='replace'), and shardkit verify --decode reports them as problems",
                        f"{n:,}", "image member is" if n == 1 else "image members are", self.first["not_image"],
                        more(n))
        n = self.count["misnamed"]
        if n:
            log.warning("shardkit: %s %s of another format than %s extension says (%s%s); indexed as %s: "
                        "shardkit decodes images by their content, but readers that go by the extension (HF "
                        "datasets, webdataset's decoders) may not", f"{n:,}", "image is" if n == 1 else "images are",
                        "its" if n == 1 else "their", self.first["misnamed"], more(n),
                        "it is" if n == 1 else "they are")
        if len(self.image_names) > 1:
            (common, _), *rest = self.image_names.most_common()
            log.warning("shardkit: %s images are %s and %s: HF datasets' webdataset loader and webdataset's "
                        "to_tuple(%r) give those samples no image (None, or a skipped sample); read them with "
                        "to_tuple(%r), or write every image member under one extension",
                        f"{sum(self.image_names.values()):,}", f"{self.image_names[common]:,} {common}",
                        ", ".join(f"{n:,} {ext}" for ext, n in rest), common,
                        ";".join(ext for ext, _ in self.image_names.most_common()))


#: TIFF and BigTIFF, both byte orders; the Netpbm headers PIL writes under either name by the mode.
_TIFF = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
_NETPBM = (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6")
#: The first bytes of each image member extension's format, for the cheap check while indexing.
_SIGNATURES: dict[str, tuple[bytes, ...]] = {
    "jpg": (b"\xff\xd8\xff",), "jpeg": (b"\xff\xd8\xff",), "png": (b"\x89PNG\r\n\x1a\n",),
    "bmp": (b"BM",), "tif": _TIFF, "tiff": _TIFF, "ppm": _NETPBM, "pgm": _NETPBM,
}


def format_of(data: bytes) -> str | None:
    r"""The image format ``data`` starts as (a member extension, or ``gif``), or None.

    >>> format_of(b"\x89PNG\r\n\x1a\n..."), format_of(b"RIFF\0\0\0\0WEBPVP8 "), format_of(b"text")
    ('png', 'webp', None)
    """
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    return next((ext for ext in ("jpg", "png", "bmp", "tif", "ppm") if data.startswith(_SIGNATURES[ext])), None)


def not_as_named(ext: str, data: bytes) -> tuple[bool, str] | None:
    r"""``(decodes, why)`` where an image member with extension ``ext`` and bytes ``data`` is not the
    image its extension says: ``decodes`` when it is one of another format (a PNG named ``.jpg``,
    which the loader decodes by its content), not when it is empty or no image format's; else None.

    >>> not_as_named("jpg", b"\xff\xd8\xff\xe0"), not_as_named("jpg", b"")
    (None, (False, 'empty (0 bytes)'))
    >>> not_as_named("png", b"not a png"), not_as_named("jpg", b"\x89PNG\r\n\x1a\n")
    ((False, "its first bytes are b'not a pn', no image format's"), (True, 'a png named .jpg'))
    """
    if not data:
        return False, "empty (0 bytes)"
    found = format_of(data)
    same = {"jpeg": "jpg", "tiff": "tif", "pgm": "ppm"}
    if found == same.get(ext, ext):
        return None
    if found is None:
        return False, f"its first bytes are {data[:8]!r}, no image format's"
    return True, f"a {found} named .{ext}"


def check_unused_run(labels: dict[int, str | None], first_at: dict[int, str]) -> None:
    """Refuse labels that leave most of the class list they imply unused in one run, as one mistyped
    label does (``999999`` among 0 and 1 makes a list of a million classes for two in use): a list
    longer than :data:`UNUSED_RUN_CLASSES`, a run of at least :data:`UNUSED_RUN_LEAST` unused
    labels, more than half the list and more than :data:`UNUSED_RUN_PER_LABEL` times the labels in
    use. Real label spaces pass whatever part of them a set of shards holds (a label space up to
    100,000 classes always does). Not called when the class names are given (``--classes``), which
    is how such labels are accepted."""
    used = sorted(labels)
    if not used:
        return
    size = used[-1] + 1
    below, above = max(zip([-1, *used], used, strict=False), key=lambda pair: pair[1] - pair[0])
    run = above - below - 1
    if (size > UNUSED_RUN_CLASSES and run >= UNUSED_RUN_LEAST and 2 * run > size
            and run > UNUSED_RUN_PER_LABEL * len(used)):
        raise FormatError(f"label {above} leaves labels {below + 1} to {above - 1} unused: {run:,} of the {size:,} "
                          f"classes its class list would hold, for {len(used):,} "
                          f"{'label' if len(used) == 1 else 'labels'} in use (a mistyped label?); if it is meant, "
                          "pass --classes FILE naming the classes in label order", where=first_at[above])
