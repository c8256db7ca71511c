"""A JPEG's frame header (SOF), read without decoding: coding process, size, components."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Literal, NamedTuple

#: Start-of-frame markers (all coding processes); 0xC4/0xC8/0xCC are DHT/JPG/DAC, not frames.
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: Sequential Huffman-coded frames (baseline, extended): what nvJPEG's batched decoder takes.
SEQUENTIAL_HUFFMAN = frozenset({0xC0, 0xC1})


class JpegFrame(NamedTuple):
    """``marker`` is the SOF marker byte (0xC0 baseline, 0xC2 progressive, …); ``sampling`` the
    first component's sampling factors, horizontal in the high nibble (0x11: 1x1; 0 when the
    header ends before them)."""

    marker: int
    height: int
    width: int
    components: int
    sampling: int = 0


#: ``_jpeg_header.frame`` (the walk below in C), or None where the C extension is not built.
_frame: Callable[[bytes | bytearray | memoryview], tuple[int, int, int, int, int] | None] | None
try:
    _frame = importlib.import_module("shardkit.codec._jpeg_header").frame
except ImportError:  # not built: the walk below in Python
    _frame = None


def jpeg_frame(b: bytes | bytearray | memoryview) -> JpegFrame | None:
    """Walk the markers after SOI to the first frame header; ``None`` if there is none or the
    header is malformed or cut short. In C where the extension ``_jpeg_header`` is built.

    >>> jpeg_frame(b"\\xff\\xd8\\xff\\xc0\\x00\\x11\\x08\\x01\\x2c\\x01\\x90\\x03")
    JpegFrame(marker=192, height=300, width=400, components=3, sampling=0)
    """
    if _frame is not None:
        try:
            found = _frame(b)
        except (BufferError, TypeError):  # e.g. a memoryview that is not contiguous
            return _walk(b)
        return None if found is None else JpegFrame(*found)
    return _walk(b)


def _walk(b: bytes | bytearray | memoryview) -> JpegFrame | None:
    """:func:`jpeg_frame` in Python."""
    i, n = 2, len(b)
    while i + 3 < n:
        if b[i] != 0xFF:
            return None
        m = b[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
        elif m == 0x01 or 0xD0 <= m <= 0xD7:  # markers without a length
            i += 2
        elif m in (0xD9, 0xDA):  # EOI/SOS before any frame
            return None
        elif m in SOF_MARKERS:
            if i + 9 >= n:
                return None
            sampling = b[i + 11] if i + 11 < n else 0
            return JpegFrame(m, (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9], sampling)
        else:
            i += 2 + ((b[i + 2] << 8) | b[i + 3])
    return None


def _exif_tiff_orientation(t: bytes) -> int:
    """Orientation tag (0x0112) of IFD0 in a TIFF block, or 0 (none or unreadable)."""
    if len(t) < 8 or t[:2] not in (b"II", b"MM"):
        return 0
    order: Literal["little", "big"] = "little" if t[:2] == b"II" else "big"

    def u(off: int, size: int) -> int:
        return int.from_bytes(t[off:off + size], order) if off + size <= len(t) else -1

    if u(2, 2) != 0x2A:
        return 0
    ifd = u(4, 4)
    count = u(ifd, 2)
    for k in range(max(count, 0)):
        entry = ifd + 2 + 12 * k
        tag = u(entry, 2)
        if tag < 0:
            return 0
        if tag == 0x0112:
            value = u(entry + 8, 2)
            return value if 1 <= value <= 8 else 0
    return 0


def exif_orientation(b: bytes | bytearray | memoryview) -> int:
    """EXIF orientation (1-8) of a JPEG, or 0 when it has none: the first APP1 ``Exif`` segment
    before the scan, IFD0 tag 0x0112 (what TorchCodec's decoders read, and then apply).

    >>> exif_orientation(b"\\xff\\xd8\\xff\\xe1\\x00\\x22Exif\\x00\\x00II*\\x00\\x08\\x00\\x00\\x00"
    ...                  b"\\x01\\x00\\x12\\x01\\x03\\x00\\x01\\x00\\x00\\x00\\x06\\x00\\x00\\x00")
    6
    """
    i, n = 2, len(b)
    while i + 3 < n:
        if b[i] != 0xFF:
            return 0
        m = b[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
        elif m == 0x01 or 0xD0 <= m <= 0xD7:  # markers without a length
            i += 2
        elif m in (0xD9, 0xDA):  # EOI/SOS: no more header segments
            return 0
        else:
            length = (b[i + 2] << 8) | b[i + 3]
            if m == 0xE1 and bytes(b[i + 4:i + 10]) == b"Exif\x00\x00":
                return _exif_tiff_orientation(bytes(b[i + 10:i + 2 + length]))
            i += 2 + length
    return 0
