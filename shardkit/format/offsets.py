"""The per-shard offsets file ``<shard>.idx``: where each sample starts and how long it is.

Text, UTF-8, one line per record::

    shardkit-offsets 1 <num_samples>
    <key> <offset> <size>
    ...

``offset`` is the byte offset of the sample's first tar header and ``size`` the bytes up to
the end of its last member's padding, so reading ``size`` bytes at ``offset`` and parsing
them with :func:`shardkit.format.tarread.parse_span` gives the whole sample.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardkit.errors import FormatError
from shardkit.format.tarwrite import SampleSpan

_MAGIC = "shardkit-offsets"
_VERSION = 1


def dump_offsets(spans: Sequence[SampleSpan]) -> bytes:
    """Serialise spans to the offsets file format."""
    lines = [f"{_MAGIC} {_VERSION} {len(spans)}"]
    lines.extend(f"{s.key} {s.offset} {s.size}" for s in spans)
    return ("\n".join(lines) + "\n").encode("ascii")


def load_offsets(data: bytes, *, where: str) -> list[SampleSpan]:
    """Parse an offsets file; raise ``FormatError`` naming ``where`` if it is malformed."""
    try:
        lines = data.decode("ascii").splitlines()
        magic, version, count_text = lines[0].split()
    except (UnicodeDecodeError, IndexError, ValueError) as err:
        raise FormatError("not a shardkit offsets file", where=where) from err
    if magic != _MAGIC:
        raise FormatError("not a shardkit offsets file", where=where)
    if version != str(_VERSION):
        raise FormatError(f"unknown offsets file version {version}", where=where)
    try:
        count = int(count_text)
    except ValueError as err:
        raise FormatError(f"malformed sample count {count_text!r} in the header",
                          where=where) from err
    spans = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            key, offset_text, size_text = line.split()
            offset, size = int(offset_text), int(size_text)
        except ValueError as err:
            raise FormatError(f"malformed line {number}", where=where) from err
        if offset < 0 or size < 0:
            raise FormatError(f"negative offset or size on line {number}", where=where)
        spans.append(SampleSpan(key, offset, size))
    if len(spans) != count:
        raise FormatError(f"header says {count} samples, file lists {len(spans)}", where=where)
    return spans
