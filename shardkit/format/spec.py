"""The shardkit format, versions 1 and 2: names of shards, keys and members (see docs/concepts/format.md)."""

from __future__ import annotations

import re

from shardkit.errors import FormatError

FORMAT_NAME = "shardkit"
FORMAT_VERSION = 1
#: Version 2 = version 1 with uniform member names (docs/concepts/format.md §2.2): the image member is always
#: ``jpg``, whatever the image's format. Written only for datasets packed with ``uniform_names``.
UNIFORM_NAMES_VERSION = 2
#: Versions this shardkit reads.
SUPPORTED_VERSIONS = (FORMAT_VERSION, UNIFORM_NAMES_VERSION)
#: The image member's extension under uniform names: the one every tool treats as an image
#: (HF ``datasets`` infers an ``Image`` column from it; all of them decode by content).
UNIFORM_IMAGE_EXT = "jpg"
INDEX_NAME = "index.json"
#: The shard table beside ``index.json`` (docs/concepts/format.md §10): its shards by column, for
#: loading without parsing the JSON; ``index.json`` names it with its sha256.
TABLE_NAME = "index.table"
#: Every shard's raw sha256, 32 bytes each, in shard order (read a block at a time).
HASHES_NAME = "index.hashes"
#: Versions of ``index.table`` this shardkit reads (and the one it writes, the last).
TABLE_VERSIONS = (1,)
SHARD_SUFFIX = ".tar"
#: Compressed tar files: shards that must be decompressed before they are indexed (a shard is read in
#: place, by byte offset, so it must be a plain tar).
COMPRESSED_SHARD_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tbz2", ".tar.xz", ".txz", ".tar.zst",
                             ".tar.zstd", ".tzst", ".tar.lz4", ".tar.lz", ".tar.lzma", ".tar.br")
#: The folder in DST where an unfinished ``shardkit pack`` keeps its plan; gone once ``index.json``
#: is written. Shards beside it are part of a pack, not a dataset.
PACK_STATE_DIR = ".shardkit-pack"
OFFSETS_SUFFIX = ".idx"

#: torchvision's ``IMG_EXTENSIONS`` (what ``ImageFolder`` accepts), lower case, without dot.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")
#: Member extensions an image may have inside a shard (after normalisation).
#: shardkit pack writes only the normalised names (`jpg`, never `jpeg`); `jpeg` is read in adopted
#: shards.
IMAGE_MEMBER_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff",
                                     "webp"})
#: PIL format name -> member extension, used when the content says what the file is.
PIL_FORMAT_EXTENSIONS = {
    "JPEG": "jpg",
    "MPO": "jpg",
    "PNG": "png",
    "PPM": "ppm",
    "BMP": "bmp",
    "TIFF": "tiff",
    "WEBP": "webp",
}

_KEY_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
_SHARD_RE = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{6,})\.tar$")


def shard_name(prefix: str, index: int) -> str:
    """Name of shard ``index``: ``"<prefix>-<NNNNNN>.tar"``.

    >>> shard_name("train", 3)
    'train-000003.tar'
    """
    if index < 0:
        raise ValueError(f"shard index must be >= 0, got {index}")
    return f"{prefix}-{index:06d}{SHARD_SUFFIX}"


def offsets_name(shard: str) -> str:
    """Name of the per-sample offsets file beside ``shard`` (``x-000000.tar`` ->
    ``x-000000.idx``)."""
    return (shard[: -len(SHARD_SUFFIX)] + OFFSETS_SUFFIX if shard.endswith(SHARD_SUFFIX)
            else shard + OFFSETS_SUFFIX)


def is_shard_name(name: str) -> bool:
    """Whether ``name`` looks like a shard this format writes."""
    return _SHARD_RE.match(name) is not None


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if usable in shard names, else raise ``ValueError``."""
    if not prefix:
        raise ValueError("invalid shard prefix '': shards need a name to start with (the default is 'shard')")
    if "/" in prefix or "\\" in prefix or prefix.startswith("."):
        raise ValueError(f"invalid shard prefix {prefix!r}: use a plain name, without slashes and not starting "
                         "with a dot")
    return prefix


def make_key(index: int, width: int) -> str:
    """The key of the sample with source index ``index``, zero-padded to ``width`` digits.

    >>> make_key(42, 8)
    '00000042'
    """
    return f"{index:0{width}d}"


def key_width(num_samples: int) -> int:
    """Digits needed for keys of a dataset of ``num_samples`` (at least 8, so keys sort
    numerically)."""
    return max(8, len(str(max(num_samples - 1, 0))))


def check_key(key: str, *, where: str = "") -> str:
    """Return ``key`` if valid (ASCII letters, digits, ``_``, ``-``; no dots or slashes)."""
    if not _KEY_RE.match(key):
        raise FormatError(f"invalid sample key {key!r} (allowed: A-Z a-z 0-9 _ -)", where=where)
    return key


def check_member_name(name: str, *, where: str = "") -> None:
    """Refuse an absolute member name or one with a ``..`` component (a reader must never write or
    name anything outside its directory).

    >>> check_member_name("train/0001.jpg")
    >>> check_member_name("../0001.jpg")
    Traceback (most recent call last):
    ...
    shardkit.errors.FormatError: unsafe member name '../0001.jpg' (absolute or '..')
    """
    if name.startswith("/") or ".." in name.split("/"):
        raise FormatError(f"unsafe member name {name!r} (absolute or '..')", where=where)


def member_name(key: str, ext: str) -> str:
    """Tar member name of field ``ext`` of sample ``key``: ``"<key>.<ext>"``."""
    return f"{key}.{ext}"


def split_member(name: str, *, where: str = "") -> tuple[str, str]:
    """Split a member name into ``(key, ext)`` at the first dot, like webdataset.

    >>> split_member("00000001.jpg")
    ('00000001', 'jpg')
    """
    key, dot, ext = name.partition(".")
    if not dot or not key or not ext:
        raise FormatError(f"member {name!r} is not named '<key>.<ext>'", where=where)
    return key, ext


def normalize_extension(suffix: str) -> str:
    """Lower-case an image file suffix and map ``jpeg``/``jpe`` to ``jpg``.

    >>> normalize_extension(".JPEG")
    'jpg'
    """
    ext = suffix.lower().lstrip(".")
    return "jpg" if ext in ("jpeg", "jpe") else ext


def uniform_member_names(fields: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Rename a sample's image field to :data:`UNIFORM_IMAGE_EXT` (docs/concepts/format.md §2.2), so every
    sample of a dataset has the same member names whatever its images' formats.

    >>> uniform_member_names([("png", b"..."), ("cls", b"1")])
    [('jpg', b'...'), ('cls', b'1')]
    """
    return [(UNIFORM_IMAGE_EXT if ext in IMAGE_MEMBER_EXTENSIONS else ext, data)
            for ext, data in fields]
