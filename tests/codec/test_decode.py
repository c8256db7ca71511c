"""decode_rgb equals PIL's convert("RGB") for every format/mode; bad bytes raise DecodeError."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit.codec.decode import DecodeStats, decode_rgb, is_jpeg, peek_size
from shardkit.errors import DecodeError


def photo(h: int = 61, w: int = 83, seed: int = 0) -> np.ndarray:
    """A smooth colour field plus noise: photo-like, and every pixel distinct-ish."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([128 + 100 * np.sin(x / 9 + c) * np.cos(y / 13 - c) for c in range(3)], -1)
    return np.clip(a + rng.normal(0, 10, a.shape), 0, 255).astype(np.uint8)


def encode(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG (gray, RGB or RGBA) written by hand: PIL cannot write 16-bit RGB."""
    h, w = arr.shape[:2]
    c = 1 if arr.ndim == 2 else arr.shape[2]
    raw = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, {1: 0, 3: 2, 4: 6}[c], 0, 0, 0)
    sig = b"\x89PNG\r\n\x1a\n"
    return sig + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def pil_rgb(data: bytes) -> torch.Tensor:
    arr = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
    return torch.from_numpy(arr).permute(2, 0, 1)


RGB = Image.fromarray(photo())
RGBA = np.dstack([photo(), photo(seed=1)[..., 0]])
WIDE16 = (photo().astype(np.uint16) * 257
          + np.random.default_rng(2).integers(0, 257, photo().shape).astype(np.uint16))
CASES = {
    "jpeg-rgb": encode(RGB, "JPEG", quality=90),
    "jpeg-444": encode(RGB, "JPEG", quality=95, subsampling=0),
    "jpeg-progressive": encode(RGB, "JPEG", quality=80, progressive=True),
    "jpeg-gray": encode(RGB.convert("L"), "JPEG"),
    "jpeg-cmyk": encode(RGB.convert("CMYK"), "JPEG"),
    "png-rgb": encode(RGB, "PNG"),
    "png-rgba": encode(Image.fromarray(RGBA), "PNG"),
    "png-palette": encode(RGB.convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
    "png-palette-trns": encode(
        RGB.convert("P", palette=Image.Palette.ADAPTIVE), "PNG", transparency=3
    ),
    "png-gray": encode(RGB.convert("L"), "PNG"),
    "png-gray-alpha": encode(RGB.convert("LA"), "PNG"),
    "png-1bit": encode(RGB.convert("1"), "PNG"),
    "png-interlaced": encode(RGB, "PNG", interlace=1),
    "png-rgb16": png16(WIDE16),
    "png-rgba16": png16(np.dstack([WIDE16, WIDE16[..., :1]])),
    "png-gray16": png16(WIDE16[..., 0]),
    "png-gray16-small": png16(WIDE16[..., 0] // 300),
    "webp-lossy": encode(RGB, "WEBP", quality=80),
    "webp-lossless-rgba": encode(Image.fromarray(RGBA), "WEBP", lossless=True),
    "bmp": encode(RGB, "BMP"),
    "gif": encode(RGB.convert("P"), "GIF"),
    "tiff": encode(RGB, "TIFF"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_pil_convert_rgb(name: str) -> None:
    data = CASES[name]
    got, want = decode_rgb(data), pil_rgb(data)
    assert got.dtype == torch.uint8 and got.shape == want.shape
    diff = (got.int() - want.int()).abs().float().mean().item()
    assert diff <= (1.0 if name.startswith("jpeg") else 0.0), diff


def test_fast_path_and_fallback_are_counted() -> None:
    stats = DecodeStats()
    decode_rgb(CASES["jpeg-rgb"], stats=stats)
    decode_rgb(CASES["webp-lossy"], stats=stats)
    decode_rgb(CASES["png-palette"], stats=stats)  # PNG: always PIL (see decode.py)
    decode_rgb(CASES["bmp"], stats=stats)
    with pytest.raises(DecodeError):
        decode_rgb(b"junk", stats=stats)
    assert (stats.fast, stats.fallback, stats.failed) == (2, 2, 1)


def test_exif_orientation_is_not_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 on display
    data = encode(RGB, "JPEG", exif=exif.tobytes())
    assert decode_rgb(data).shape == (3, RGB.height, RGB.width)
    assert torch.equal(decode_rgb(data), pil_rgb(data))
    assert peek_size(data) == (RGB.height, RGB.width)


@pytest.mark.parametrize(
    "wrap",
    [
        bytes,
        bytearray,
        memoryview,
        lambda b: memoryview(bytearray(b)),
        lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8),
    ],
)
def test_buffer_types(wrap) -> None:
    for name in ["jpeg-rgb", "png-rgb"]:
        data = CASES[name]
        assert torch.equal(decode_rgb(wrap(data)), pil_rgb(data))
        assert peek_size(wrap(data)) == (RGB.height, RGB.width)


JPEG = CASES["jpeg-rgb"]
BAD = {
    "empty": b"",
    "zeros": bytes(1000),
    "text": b"hello, not an image",
    "jpeg-header-only": JPEG[:40],
    "jpeg-truncated": JPEG[: len(JPEG) // 2],
    "png-truncated": CASES["png-rgb"][: len(CASES["png-rgb"]) // 2],
    "png-bad-idat": CASES["png-rgb"][:60] + bytes(200) + CASES["png-rgb"][260:],
    "webp-truncated": CASES["webp-lossy"][:100],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_bytes_raise_decode_error_with_context(name: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_rgb(BAD[name], where="shard-000001.tar:key42.jpg")
    assert info.value.where == "shard-000001.tar:key42.jpg"
    assert "key42" in str(info.value)


@pytest.mark.parametrize("name", ["jpeg-rgb", "png-rgb", "bmp"])
def test_decompression_bomb_limit(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL raises above twice this
    with pytest.raises(DecodeError):
        decode_rgb(CASES[name], where="bomb")


@pytest.mark.parametrize("name", ["jpeg-rgb", "jpeg-progressive", "jpeg-cmyk", "png-rgb16",
                                  "webp-lossy", "gif"])
def test_peek_size_reads_the_header(name: str) -> None:
    assert peek_size(CASES[name]) == (RGB.height, RGB.width)
    if name.startswith(("jpeg", "png")):  # parsed here from the header alone
        assert peek_size(CASES[name][:200]) == (RGB.height, RGB.width)


def test_peek_size_rejects_garbage_and_is_jpeg() -> None:
    with pytest.raises(DecodeError):
        peek_size(b"nothing here")
    assert is_jpeg(JPEG) and not is_jpeg(CASES["png-rgb"]) and not is_jpeg(b"")
