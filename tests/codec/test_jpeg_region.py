"""Region JPEG decoding equals the same box of a full decode, pixel for pixel."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest
import torch
from PIL import Image

from shardkit.codec import jpeg_restart
from shardkit.codec.decode import decode_rgb, peek_size
from shardkit.codec.jpeg_region import decode_box_rgb, roi_available
from shardkit.transforms import CropFlip, imagenet_train

if roi_available():
    from shardkit.codec import _jpeg_region  # type: ignore[attr-defined]

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "imagefolder"


def test_extension_is_built_where_libjpeg_headers_exist() -> None:
    if os.path.exists("/usr/include/jpeglib.h"):
        assert roi_available(), ("libjpeg headers are here but shardkit.codec._jpeg_region was not "
                                 "built")


def _full_box(data: bytes, box: CropFlip) -> torch.Tensor:
    """``box`` of a full decode by the same libjpeg (other builds may round the IDCT otherwise)."""
    h, w = peek_size(data)
    full = torch.frombuffer(_jpeg_region.decode_crop(data, 0, 0, h, w), dtype=torch.uint8)
    full = full.view(h, w, 3)
    return full[box.top : box.top + box.height, box.left : box.left + box.width].permute(2, 0, 1)


@pytest.mark.skipif(not roi_available(), reason="region decoder not built")
def test_random_crops_match_full_decode() -> None:
    rng = random.Random(0)
    transform = imagenet_train(224)
    checked = 0
    for path in sorted(SAMPLE.rglob("*.jpg"))[:80]:
        data = path.read_bytes()
        h, w = peek_size(data)
        box = transform.sample_params(h, w, rng)
        region = decode_box_rgb(data, box)
        assert region is not None, path
        # upsampling context kept beside the box: exact
        assert torch.equal(region, _full_box(data, box))
        other = decode_rgb(data)[:, box.top : box.top + box.height, box.left : box.left + box.width]
        # torchvision's libjpeg build
        assert (region.int() - other.int()).abs().float().mean() < 0.1
        checked += 1
    assert checked > 60


@pytest.mark.skipif(not roi_available(), reason="region decoder not built")
@pytest.mark.parametrize("make", ["png", "truncated", "garbage", "outside"])
def test_anything_unusual_asks_for_a_full_decode(make: str) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, "PNG" if make == "png" else "JPEG")
    data = buf.getvalue()
    box = CropFlip(0, 0, 48, 64)
    if make == "truncated":
        data = data[: len(data) // 2]
    elif make == "garbage":
        data = b"\xff\xd8\xff" + bytes(200)
    elif make == "outside":
        box = CropFlip(10, 10, 48, 64)
    assert decode_box_rgb(data, box) is None


@pytest.mark.skipif(not roi_available(), reason="region decoder not built")
@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
def test_cmyk_boxes_are_what_pil_converts_to_rgb(subsampling: int) -> None:
    """A CMYK JPEG's box: exactly PIL's ``open(...).convert("RGB")`` there (what the full decode
    falls back to), edges and a 1x1 box included."""
    rng = random.Random(subsampling)
    photo = Image.open(sorted(SAMPLE.rglob("*.jpg"))[0]).convert("RGB").resize((203, 157))
    buf = io.BytesIO()
    photo.convert("CMYK").save(buf, "JPEG", quality=90, subsampling=subsampling)
    data = buf.getvalue()
    reference = Image.open(io.BytesIO(data))
    assert reference.mode == "CMYK"
    rgb = torch.frombuffer(bytearray(reference.convert("RGB").tobytes()), dtype=torch.uint8).view(157, 203, 3)
    transform = imagenet_train(64)
    for box in [*(transform.sample_params(157, 203, rng) for _ in range(20)), CropFlip(0, 0, 157, 203),
                CropFlip(156, 202, 1, 1), CropFlip(3, 190, 50, 13)]:
        region = decode_box_rgb(data, box)
        assert region is not None, box
        expected = rgb[box.top:box.top + box.height, box.left:box.left + box.width].permute(2, 0, 1)
        assert torch.equal(region, expected), box
    assert decode_box_rgb(data[: len(data) // 2], CropFlip(0, 0, 157, 203)) is None  # truncated: full decode


@pytest.mark.skipif(not roi_available(), reason="region decoder not built")
def test_ycck_jpegs_still_go_to_the_full_decode() -> None:
    buf = io.BytesIO()
    Image.new("CMYK", (40, 30), (10, 20, 30, 40)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    app14 = data.find(b"\xff\xee\x00\x0eAdobe")  # APP14, 14 bytes: the transform is its last
    assert app14 > 0 and data[app14 + 15] == 0  # Adobe transform 0: CMYK
    assert decode_box_rgb(bytes(data), CropFlip(0, 0, 30, 40)) is not None
    data[app14 + 15] = 2  # YCCK
    assert decode_box_rgb(bytes(data), CropFlip(0, 0, 30, 40)) is None


@pytest.mark.skipif(not roi_available(), reason="region decoder not built")
def test_gray_jpeg_comes_back_as_rgb() -> None:
    buf = io.BytesIO()
    Image.new("L", (40, 30), 77).save(buf, "JPEG")
    region = decode_box_rgb(buf.getvalue(), CropFlip(5, 3, 20, 30))
    assert region is not None and region.shape == (3, 20, 30)
    assert torch.all((region.int() - 77).abs() <= 1)


@pytest.mark.skipif(not (roi_available() and jpeg_restart.available()),
                    reason="extensions not built")
def test_restart_indexed_jpegs_decode_the_same_boxes() -> None:
    """Cut to the restart intervals around the box first: still exactly the full decode's pixels."""
    rng = random.Random(1)
    transform = imagenet_train(224)
    checked = 0
    for path in sorted(SAMPLE.rglob("*.jpg"))[:80]:
        data = path.read_bytes()
        indexed = jpeg_restart.transcode(data, 4)
        if indexed is None:  # CMYK stays as it is
            continue
        h, w = peek_size(data)
        for box in [transform.sample_params(h, w, rng), CropFlip(0, 0, h, w),
                    CropFlip(h - 1, w - 1, 1, 1)]:
            region = decode_box_rgb(indexed, box)
            assert region is not None
            assert torch.equal(region, _full_box(data, box)), box
        checked += 1
    assert checked > 60
