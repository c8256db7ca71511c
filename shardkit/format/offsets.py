"""The per-shard offsets file ``<shard>.idx``: where each sample starts and how long it is.

Text, ASCII, one line per record::

    shardkit-offsets 2 <num_samples>
    <key> <offset> <size> <crc32>
    ...

``offset`` is the byte offset of the sample's first tar header and ``size`` the bytes up to
the end of its last member's padding, so reading ``size`` bytes at ``offset`` and parsing
them with :func:`shardkit.format.tarread.parse_span` gives the whole sample. ``crc32`` (version
2) is the CRC-32 of those bytes (``zlib.crc32``), 8 lower-case hex digits: the loader checks it
on every read, so bytes flipped after packing (a disk, a copy) are a corrupt sample, not decoded
garbage. Version 1 lines have no ``crc32`` (packs and adopted shards of shardkit 0.1); both are read.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardkit.errors import FormatError
from shardkit.format.tarwrite import SampleSpan

_MAGIC = "shardkit-offsets"
#: Version 2 when every span has its CRC-32, else 1.
_VERSIONS = ("1", "2")


def dump_offsets(spans: Sequence[SampleSpan]) -> bytes:
    """Serialise spans to the offsets file format: version 2 (with each sample's CRC-32) when
    every span has one (an empty shard's too), else version 1."""
    if all(s.crc32 is not None for s in spans):
        lines = [f"{_MAGIC} 2 {len(spans)}", *(f"{s.key} {s.offset} {s.size} {s.crc32:08x}" for s in spans)]
    else:
        lines = [f"{_MAGIC} 1 {len(spans)}", *(f"{s.key} {s.offset} {s.size}" for s in spans)]
    return ("\n".join(lines) + "\n").encode("ascii")


#: What to do about an offsets file beside a shard that does not parse, for messages.
REPAIR = ("it is damaged or another tool's: copy it again with its shard, or delete it to have the shard scanned "
          "instead (its samples then go unchecked against their CRC-32s)")


def load_offsets(data: bytes, *, where: str) -> list[SampleSpan]:
    """Parse an offsets file; raise ``FormatError`` naming ``where`` if it is malformed."""
    try:
        lines = data.decode("ascii").splitlines()
        magic, version, count_text = lines[0].split()
    except (UnicodeDecodeError, IndexError, ValueError) as err:
        raise FormatError("not a shardkit offsets file", where=where) from err
    if magic != _MAGIC:
        raise FormatError("not a shardkit offsets file", where=where)
    if version not in _VERSIONS:
        raise FormatError(f"unknown offsets file version {version}", where=where)
    fields = 3 if version == "1" else 4
    try:
        count = int(count_text)
    except ValueError as err:
        raise FormatError(f"malformed sample count {count_text!r} in the header",
                          where=where) from err
    spans = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split()
        try:
            if len(parts) != fields:
                raise ValueError(f"{len(parts)} fields")
            key, offset, size = parts[0], int(parts[1]), int(parts[2])
            crc = None if fields == 3 else _crc(parts[3])
        except ValueError as err:
            raise FormatError(f"malformed line {number}", where=where) from err
        if offset < 0 or size < 0:
            raise FormatError(f"negative offset or size on line {number}", where=where)
        spans.append(SampleSpan(key, offset, size, crc))
    if len(spans) != count:
        raise FormatError(f"header says {count} samples, file lists {len(spans)}", where=where)
    return spans


def _crc(text: str) -> int:
    """A CRC-32 written as 8 lower-case hex digits."""
    if len(text) != 8 or text.strip("0123456789abcdef"):
        raise ValueError(f"crc32 {text!r} is not 8 lower-case hex digits")
    return int(text, 16)
