"""Restart-indexed JPEGs: decode a crop without entropy-decoding the rest of the image.

A baseline JPEG is one entropy-coded stream: to decode a box, libjpeg must Huffman-decode every
row above it and every column beside it. Re-encoded *losslessly* (same DCT coefficients, so the
same pixels) with a restart marker every few MCUs, and with every MCU row holding whole restart
intervals, the intervals covering a box can be copied behind the original headers into a small
JPEG of just that region (:func:`cut`): decoding then costs what the box costs. ``shardkit pack
--jpeg-restart N`` stores images this way (:func:`transcode`); the loader cuts every crop it
can, on the CPU path before libjpeg, on the GPU path before nvJPEG. Plain readers (webdataset,
PIL, browsers) decode these files as usual, to identical pixels.

Backed by the C extension ``shardkit.codec._jpeg_restart`` (built at install against the system
libjpeg); without it :func:`transcode` raises and :func:`cut` returns ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Cut", "available", "cut", "transcode"]

Bytes = bytes | bytearray | memoryview
_transcode: Callable[[Bytes, int], bytes | None] | None = None
_cut: (Callable[[Bytes, int, int, int, int, int], tuple[bytes, int, int, int, int] | None]
       | None) = None
try:
    from shardkit.codec import _jpeg_restart  # type: ignore[attr-defined]

    _transcode, _cut = _jpeg_restart.transcode, _jpeg_restart.cut
except ImportError:  # built without libjpeg headers
    pass

#: Pixels of context kept around a box: enough for libjpeg's and nvJPEG's chroma upsampling to
#: see the same neighbours as in a full decode (one chroma sample = two luma pixels).
CONTEXT = 2


class Cut(NamedTuple):
    """A JPEG of the region ``[top, top + height) x [left, left + width)`` of the original."""

    data: bytes
    top: int
    left: int
    height: int
    width: int


def available() -> bool:
    """Whether this installation can transcode and cut (the C extension was built)."""
    return _cut is not None


def transcode(data: Bytes, max_interval: int = 1) -> bytes | None:
    """``data`` (a YCbCr or grayscale JPEG) losslessly re-encoded to be restart-indexed.

    Single-scan sequential, optimised Huffman tables, a restart marker every ``k`` MCUs where
    ``k`` is the largest divisor of the MCUs per row that is ``<= max_interval``; APPn/COM
    markers (EXIF, ICC) kept. Decodes to exactly the pixels of ``data``. Size: the markers cost
    ~2.5 bytes per interval, optimised Huffman tables save a few percent: at interval 1, -0.4%
    on our ImageNet-like set (16x16 MCUs), +6% to +8% for already optimised colour photos, up to
    +21% for grayscale ones (8x8 MCUs, four times the markers).
    ``None`` for JPEGs in other colour spaces (CMYK, YCCK, RGB): keep those as they are.

    Raises ``ValueError`` (libjpeg's message) for data libjpeg cannot read or warns about
    (corrupt, truncated), or when the C extension is missing.
    Example: ``restartable = transcode(open("a.jpg", "rb").read()) or original``.
    """
    if _transcode is None:
        raise ValueError("JPEG re-encoding needs shardkit's C extension (install libjpeg headers "
                         "and reinstall)")
    return _transcode(data, max_interval)


def cut(data: Bytes, top: int, left: int, height: int, width: int,
        context: int = CONTEXT) -> Cut | None:
    """The smallest restart-interval-aligned JPEG holding the box plus ``context`` pixels.

    ``None`` when ``data`` is not a restart-indexed JPEG (or its markers are not where its
    headers say: decode the original, which then reports the damage), or the box is not inside
    the image. Never raises for bad data. Example::

        piece = cut(raw, top, left, h, w)
        if piece is not None:
            raw, top, left = piece.data, top - piece.top, left - piece.left
    """
    if _cut is None:
        return None
    got = _cut(data, top, left, height, width, context)
    return None if got is None else Cut(*got)
