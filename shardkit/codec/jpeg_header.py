"""A JPEG's frame header (SOF), read without decoding: coding process, size, components."""

from __future__ import annotations

from dataclasses import dataclass

#: Start-of-frame markers (all coding processes); 0xC4/0xC8/0xCC are DHT/JPG/DAC, not frames.
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: Sequential Huffman-coded frames (baseline, extended): what nvJPEG's batched decoder takes.
SEQUENTIAL_HUFFMAN = frozenset({0xC0, 0xC1})


@dataclass(frozen=True)
class JpegFrame:
    """``marker`` is the SOF marker byte (0xC0 baseline, 0xC2 progressive, …)."""

    marker: int
    height: int
    width: int
    components: int


def jpeg_frame(b: bytes | bytearray | memoryview) -> JpegFrame | None:
    """Walk the markers after SOI to the first frame header; ``None`` if there is none or the
    header is malformed or cut short.

    >>> jpeg_frame(b"\\xff\\xd8\\xff\\xc0\\x00\\x11\\x08\\x01\\x2c\\x01\\x90\\x03")
    JpegFrame(marker=192, height=300, width=400, components=3)
    """
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
            return JpegFrame(m, (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9])
        else:
            i += 2 + ((b[i + 2] << 8) | b[i + 3])
    return None
