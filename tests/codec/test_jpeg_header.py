"""The C reader of a JPEG's frame header (``shardkit.codec._jpeg_header``) against the Python walk:
``jpeg_frame`` must answer exactly as ``_walk`` does on every header, intact, cut short or damaged."""

from __future__ import annotations

import importlib
import io
import random

import pytest
from PIL import Image

from shardkit.codec.jpeg_header import JpegFrame, _walk, jpeg_frame


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: an APP1 segment before the frame
    return exif.tobytes()


def _jpeg(mode: str, size: tuple[int, int], **save: object) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128).save(buf, "JPEG", **save)
    return buf.getvalue()


JPEGS = {
    "baseline": _jpeg("RGB", (40, 30)),
    "progressive": _jpeg("RGB", (17, 300), progressive=True),
    "gray": _jpeg("L", (8, 8)),
    "cmyk": _jpeg("CMYK", (9, 5)),
    "exif": _jpeg("RGB", (3, 2), exif=_exif()),
}


def test_the_extension_is_built() -> None:
    # the Makefile and pip install build it; without it every header is walked in Python
    frame = importlib.import_module("shardkit.codec._jpeg_header").frame
    assert frame(JPEGS["baseline"])[1:4] == (30, 40, 3)
    assert frame(b"") is None
    assert frame(JPEGS["baseline"][:4]) is None


@pytest.mark.parametrize("name", list(JPEGS))
def test_intact_headers_read_alike(name: str) -> None:
    data = JPEGS[name]
    found = jpeg_frame(data)
    assert isinstance(found, JpegFrame) and found == _walk(data)
    assert jpeg_frame(memoryview(data)) == found == jpeg_frame(bytearray(data))
    width, height = Image.open(io.BytesIO(data)).size
    assert (found.height, found.width) == (height, width)


@pytest.mark.parametrize("name", list(JPEGS))
def test_cut_and_damaged_headers_answer_alike(name: str) -> None:
    rng = random.Random(name)
    data = JPEGS[name]
    head = data.index(b"\xff\xda") + 2  # up to the scan: everything the walk reads
    for cut in range(head + 1):
        assert jpeg_frame(data[:cut]) == _walk(data[:cut]), cut
    for _ in range(2000):
        bad = bytearray(data[:head + 16])
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(len(bad))] = rng.choice([0xFF, 0xC0, 0xC2, 0xC4, 0xD0, 0xD9, 0xDA, 0x01, 0x00,
                                                       rng.randrange(256)])
        assert jpeg_frame(bytes(bad)) == _walk(bytes(bad)), bytes(bad).hex()


def test_a_buffer_the_c_reader_cannot_take_is_walked_in_python() -> None:
    data = JPEGS["baseline"]
    doubled = bytes(b for byte in data for b in (byte, 0))
    strided = memoryview(doubled)[::2]  # not contiguous: the C reader refuses the buffer
    assert jpeg_frame(strided) == _walk(data)
