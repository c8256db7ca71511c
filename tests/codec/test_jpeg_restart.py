"""Restart-indexed JPEGs: ``transcode`` keeps every pixel, ``cut`` gives a box's exact pixels."""

import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shardkit.codec import jpeg_restart
from shardkit.codec.jpeg_restart import cut, transcode

pytestmark = pytest.mark.skipif(not jpeg_restart.available(),
                                reason="C extension _jpeg_restart not built")

PHOTOS = sorted((Path(__file__).resolve().parents[2] / "sample_data" / "photos").glob("*.jpg"))


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    """Smooth gradients plus noise: every 8x8 block differs, so a misplaced block shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    noisy = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255)
    return Image.fromarray(noisy.astype(np.uint8))


def _jpeg(img: Image.Image, **save: object) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", **save)
    return out.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img)


def _restart_interval(data: bytes) -> int | None:
    """The DRI value in the headers (None without one); walks the markers up to SOS."""
    p = 2
    while p + 4 <= len(data) and data[p] == 0xFF:
        marker, length = data[p + 1], int.from_bytes(data[p + 2:p + 4], "big")
        if marker == 0xDD:
            return int.from_bytes(data[p + 4:p + 6], "big")
        if marker == 0xDA:
            return None
        p += 2 + length
    return None


def _rst_markers(data: bytes) -> list[int]:
    return [i for i in range(len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]


# --- transcode -------------------------------------------------------------------------------

@pytest.mark.parametrize("path", PHOTOS, ids=lambda p: p.stem)
def test_transcode_sample_photos_lossless(path):
    original = path.read_bytes()
    restarted = transcode(original)
    assert restarted is not None and restarted != original
    assert np.array_equal(_pixels(restarted), _pixels(original))
    assert _restart_interval(restarted) is not None and _rst_markers(restarted)
    # a marker per MCU costs ~2.5 bytes: +21% for the 512x512 grayscale brick (8x8 MCUs), a few
    # percent for colour photos (16x16 MCUs)
    assert 0.9 < len(restarted) / len(original) < 1.25
    assert 0.9 < len(transcode(original, 4) or b"") / len(original) < 1.1


@pytest.mark.parametrize("size", [(1, 1), (17, 9), (500, 375), (496, 40), (64, 64), (8, 300)])
@pytest.mark.parametrize("kind", ["420", "422", "444", "gray", "progressive"])
def test_transcode_lossless(size, kind):
    img = _noise(size[0], size[1], seed=size[0])
    if kind == "gray":
        original = _jpeg(img.convert("L"))
    elif kind == "progressive":
        original = _jpeg(img, progressive=True, subsampling=2)
    else:
        original = _jpeg(img, subsampling={"420": 2, "422": 1, "444": 0}[kind])
    restarted = transcode(original, 4)
    assert restarted is not None
    assert np.array_equal(_pixels(restarted), _pixels(original))
    with Image.open(io.BytesIO(restarted)) as out:
        assert out.size == size and out.mode == ("L" if kind == "gray" else "RGB")
        assert not out.info.get("progressive")


@pytest.mark.parametrize(
    ("width", "subsampling", "max_interval", "expected"),
    [
        (496, 2, 4, 1),    # 31 MCUs of 16 px per row: prime, so one MCU per interval
        (512, 2, 4, 4),    # 32 MCUs
        (480, 2, 4, 3),    # 30 MCUs: 4 does not divide, 3 does
        (480, 0, 4, 4),    # 60 MCUs of 8 px (4:4:4)
        (480, 2, 1, 1),
        (17, 2, 4, 2),     # 2 MCUs
    ],
)
def test_transcode_interval_divides_mcus_per_row(width, subsampling, max_interval, expected):
    restarted = transcode(_jpeg(_noise(width, 24), subsampling=subsampling), max_interval)
    assert restarted is not None
    assert _restart_interval(restarted) == expected


def test_transcode_keeps_exif_and_icc():
    # > 64 KiB: two APP2 markers
    icc = b"\0\0\2\x0cfake icc profile for the test" + bytes(range(256)) * 300
    exif = Image.Exif()
    exif[0x010F] = "shardkit test camera"  # Make
    original = _jpeg(_noise(40, 30), icc_profile=icc, exif=exif.tobytes())
    restarted = transcode(original)
    assert restarted is not None
    with Image.open(io.BytesIO(restarted)) as out:
        assert out.info["icc_profile"] == icc
        assert out.getexif()[0x010F] == "shardkit test camera"
    assert np.array_equal(_pixels(restarted), _pixels(original))
    assert _markers(restarted)[:2] == _markers(original)[:2]
    # a camera file: EXIF first, no JFIF segment; none is added (EXIF must follow SOI)
    assert original[2:4] == b"\xff\xe0"
    camera = original[:2] + original[4 + int.from_bytes(original[4:6], "big") :]
    assert _markers(camera)[0] == 0xE1
    assert _markers(transcode(camera) or b"")[0] == 0xE1


def _markers(data: bytes) -> list[int]:
    """The marker codes from SOI up to the scan."""
    out, p = [], 2
    while data[p + 1] != 0xDA:
        out.append(data[p + 1])
        p += 2 + int.from_bytes(data[p + 2 : p + 4], "big")
    return out


@pytest.mark.parametrize("mode", ["CMYK"])
def test_transcode_other_colour_spaces_none(mode):
    assert transcode(_jpeg(Image.new(mode, (20, 10), (10, 20, 30, 40)))) is None


@pytest.mark.parametrize("damage", ["truncated", "garbage_scan", "not_jpeg", "empty"])
def test_transcode_corrupt_raises(damage):
    original = _jpeg(_noise(96, 64))
    data = {
        "truncated": original[: len(original) // 2],
        "garbage_scan": original[:-200] + b"\xff\xd3" * 20 + original[-160:],
        "not_jpeg": b"hello, I am text",
        "empty": b"",
    }[damage]
    with pytest.raises(ValueError):
        transcode(data)


def test_transcode_rejects_bad_interval():
    with pytest.raises(ValueError):
        transcode(_jpeg(_noise(16, 16)), 0)


def test_transcode_is_deterministic():
    original = PHOTOS[0].read_bytes()
    assert transcode(original) == transcode(bytearray(original)) == transcode(memoryview(original))


# --- cut -------------------------------------------------------------------------------------

def _check_cut(data: bytes, full: np.ndarray, top: int, left: int, h: int, w: int) -> None:
    piece = cut(data, top, left, h, w)
    assert piece is not None
    part = _pixels(piece.data)
    assert part.shape[:2] == (piece.height, piece.width)
    assert 0 <= piece.top <= top and 0 <= piece.left <= left
    assert piece.top + piece.height >= top + h and piece.left + piece.width >= left + w
    got = part[top - piece.top: top - piece.top + h, left - piece.left: left - piece.left + w]
    # Exact for every sampling: the 2 px of context give libjpeg's fancy (triangle) chroma
    # upsampling the same neighbouring chroma samples as in the full decode (with 0 px, 4:2:0
    # boxes differ by up to ~60 levels at interval edges; 1 px is enough here, 2 is the margin).
    np.testing.assert_array_equal(got, full[top:top + h, left:left + w])


_KINDS = st.sampled_from(["420", "422", "444", "gray"])


@st.composite
def _images_and_boxes(draw):
    width, height = draw(st.integers(1, 150)), draw(st.integers(1, 120))
    kind, interval = draw(_KINDS), draw(st.integers(1, 6))
    top = draw(st.integers(0, height - 1))
    left = draw(st.integers(0, width - 1))
    h = draw(st.integers(1, height - top))
    w = draw(st.integers(1, width - left))
    return width, height, kind, interval, (top, left, h, w), draw(st.integers(0, 2**16))


def _restarted(width, height, kind, interval, seed) -> bytes:
    img = _noise(width, height, seed)
    if kind == "gray":
        original = _jpeg(img.convert("L"))
    else:
        original = _jpeg(img, subsampling={"420": 2, "422": 1, "444": 0}[kind])
    data = transcode(original, interval)
    assert data is not None
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_images_and_boxes())
def test_cut_gives_the_box_pixels(case):
    width, height, kind, interval, box, seed = case
    data = _restarted(width, height, kind, interval, seed)
    _check_cut(data, _pixels(data), *box)


@pytest.mark.parametrize("kind", ["420", "422", "444", "gray"])
def test_cut_edges_corners_and_whole_image(kind):
    width, height = 133, 77
    data = _restarted(width, height, kind, 3, 1)
    full = _pixels(data)
    boxes = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1),
             (0, width - 1, height, 1), (height - 1, 0, 1, width), (0, 40, 5, 20), (70, 100, 7, 33),
             (31, 31, 1, 1), (16, 16, 16, 16)]
    for box in boxes:
        _check_cut(data, full, *box)
    whole = cut(data, 0, 0, height, width)
    assert (whole is not None
            and (whole.top, whole.left, whole.height, whole.width) == (0, 0, height, width))


def test_cut_small_box_is_small():
    data = transcode(_jpeg(_noise(512, 512), subsampling=2), 4)
    assert data is not None
    piece = cut(data, 200, 200, 32, 32)
    assert piece is not None
    assert len(piece.data) < len(data) / 10
    assert piece.width <= 32 + 2 * 64 and piece.height <= 32 + 2 * 16 + 16


def test_cut_not_restart_indexed_none():
    plain = _jpeg(_noise(64, 64))
    assert cut(plain, 0, 0, 8, 8) is None
    progressive = _jpeg(_noise(64, 64), progressive=True)
    assert cut(progressive, 0, 0, 8, 8) is None


@pytest.mark.parametrize("data", [b"", b"\xff\xd8", b"hello, I am text",
                                  b"\xff\xd8\xff\xdd\x00\x04\x00\x01"],
                         ids=["empty", "soi", "text", "dri_only"])
def test_cut_garbage_none(data):
    assert cut(data, 0, 0, 1, 1) is None


def test_cut_png_none():
    out = io.BytesIO()
    _noise(16, 16).save(out, "PNG")
    assert cut(out.getvalue(), 0, 0, 4, 4) is None


def test_cut_corrupt_rst_sequence_none():
    data = _restarted(64, 64, "420", 1, 3)
    markers = _rst_markers(data)
    assert len(markers) > 4
    broken = bytearray(data)
    broken[markers[2] + 1] = 0xD0 + (broken[markers[2] + 1] - 0xD0 + 3) % 8  # RST2 -> RST5
    assert cut(bytes(broken), 60, 60, 2, 2) is None
    missing = data[:markers[1]] + data[markers[1] + 2:]  # one RST marker dropped
    assert cut(missing, 60, 60, 2, 2) is None


def test_cut_truncated_none():
    data = _restarted(64, 64, "444", 2, 4)
    assert cut(data[: len(data) // 2], 60, 60, 2, 2) is None
    assert cut(data[:300], 0, 0, 1, 1) is None


@pytest.mark.parametrize("box", [(0, 0, 65, 1), (0, 0, 1, 65), (64, 0, 1, 1), (0, 64, 1, 1),
                                 (-1, 0, 1, 1), (0, -1, 1, 1), (0, 0, 0, 1), (0, 0, 1, 0),
                                 (10, 10, -3, 4)])
def test_cut_box_outside_none(box):
    assert cut(_restarted(64, 64, "420", 4, 5), *box) is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(-5, 80), st.integers(-5, 80), st.integers(-2, 80),
       st.integers(-2, 80))
def test_cut_never_raises(noise, top, left, h, w):
    base = _restarted(48, 40, "420", 3, 6)
    for data in (noise, base[:200] + noise, base[: len(base) // 2] + noise):
        piece = cut(data, top, left, h, w)
        assert piece is None or isinstance(piece.data, bytes)


# --- regressions found by review (fuzzing and hand-made headers) -------------------------------

_SOF_GRAY_16 = b"\xff\xc0\x00\x0b\x08\x00\x10\x00\x10\x01\x01\x11\x00"  # SOF0 16x16, one component
_DRI_1 = b"\xff\xdd\x00\x04\x00\x01"


def test_cut_never_reads_past_a_buffer_ending_in_a_short_sos():
    import ctypes
    import mmap

    # SOS of length 2, then the end
    data = b"\xff\xd8" + _SOF_GRAY_16 + _DRI_1 + b"\xff\xda\x00\x02"
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    m[page - len(data) : page] = data
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # guard page
    assert libc.mprotect(ctypes.addressof(ctypes.c_char.from_buffer(m)) + page, page, 0) == 0
    # a segfault before the fix
    assert cut(memoryview(m)[page - len(data) : page], 0, 0, 1, 1) is None


def test_cut_of_lying_dimensions_allocates_nothing_big():
    import tracemalloc

    huge = b"\xff\xc0\x00\x0b\x08\xff\xff\xff\xff\x01\x01\x11\x00"  # 65535x65535
    data = (b"\xff\xd8" + huge + _DRI_1 + b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + bytes(10)
            + b"\xff\xd9")
    tracemalloc.start()
    try:
        assert cut(data, 65000, 65000, 100, 100) is None
        assert tracemalloc.get_traced_memory()[1] < 10**6  # was 533 MB for the interval starts
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("subsampling", [2, 1, 0], ids=["420", "422", "444"])
def test_cut_at_a_narrow_last_interval_keeps_the_chroma_filter(subsampling):
    """A piece <= 4 px wide (the last, partial interval) would get libjpeg's box chroma
    upsampling."""
    rng = np.random.default_rng(subsampling)
    for width in range(17, 53):
        img = Image.fromarray(rng.integers(0, 256, (32, width, 3), dtype=np.uint8))
        data = transcode(_jpeg(img, subsampling=subsampling, quality=90), 1)
        assert data is not None
        full = _pixels(data)
        for left in range(max(0, width - 4), width):
            piece = cut(data, 8, left, 8, width - left)
            assert piece is not None
            box = _pixels(piece.data)[8 - piece.top : 16 - piece.top,
                                      left - piece.left : width - piece.left]
            assert np.array_equal(box, full[8:16, left:width]), (width, left)
