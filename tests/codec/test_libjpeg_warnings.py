"""libjpeg's warnings about corrupt but decodable JPEGs are counted and logged once, never printed
raw on stderr ("Corrupt JPEG data: 3 extraneous bytes before marker 0xda" lines, one
per image, from torchvision's libjpeg, which keeps libjpeg's printing handler)."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit.codec import decode as decode_module
from shardkit.codec import libjpeg
from shardkit.codec.decode import DecodeStats, decode_rgb
from shardkit.codec.jpeg_region import decode_box_rgb
from shardkit.transforms.params import CropFlip

pytestmark = pytest.mark.skipif(not libjpeg.available(), reason="shardkit's C extension is not built")

WARNING = "Corrupt JPEG data: 3 extraneous bytes before marker 0xda"


def damaged_jpeg(seed: int = 0, mode: str = "RGB") -> bytes:
    """A JPEG with 3 stray bytes before its scan: every decoder decodes it, libjpeg warns."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).convert(mode).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    scan = data.index(b"\xff\xda")
    return data[:scan] + b"\x00\x01\x02" + data[scan:]


def pil_rgb(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as im:
        return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)


def test_the_extension_returns_the_warning_with_the_pixels() -> None:
    got = libjpeg.decode_jpeg(damaged_jpeg())
    assert got is not None
    assert got.warnings == 1 and got.warning == WARNING
    assert torch.equal(got.image, pil_rgb(damaged_jpeg()))


def test_a_truncated_jpeg_is_an_error_not_a_grey_tail() -> None:
    data = damaged_jpeg()
    with pytest.raises(ValueError, match="Premature end of JPEG file"):
        libjpeg.decode_jpeg(data[: len(data) * 2 // 3])


def test_the_region_decoder_names_the_warning_it_refuses() -> None:
    from shardkit.codec import _jpeg_region  # type: ignore[attr-defined]

    with pytest.raises(ValueError, match=f"corrupt JPEG data \\({WARNING}\\)"):
        _jpeg_region.decode_crop(damaged_jpeg(), 0, 0, 8, 8)


def test_decode_rgb_counts_logs_once_and_prints_nothing(capfd: pytest.CaptureFixture[str],
                                                        caplog: pytest.LogCaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_module, "_warned", [False])  # as in a fresh process
    stats = DecodeStats()
    with caplog.at_level(logging.WARNING, logger="shardkit.codec"):
        for seed in range(3):
            data = damaged_jpeg(seed)
            assert torch.equal(decode_rgb(data, where=f"s.tar:{seed}", stats=stats), pil_rgb(data))
        region = decode_box_rgb(damaged_jpeg(), CropFlip(0, 0, 8, 8))  # refuses: the full decode decides
    assert region is None
    assert (stats.warnings, stats.fast, stats.fallback) == (3, 3, 0)
    records = [r.getMessage() for r in caplog.records if r.name == "shardkit.codec"]
    assert len(records) == 1 and records[0].startswith(f"s.tar:0: libjpeg: {WARNING}"), records
    assert "Corrupt JPEG" not in capfd.readouterr().err  # libjpeg's own line would land on fd 2


def test_a_cmyk_jpeg_libjpeg_warns_about_goes_to_pil_not_to_a_printing_decoder(
        capfd: pytest.CaptureFixture[str]) -> None:
    data = damaged_jpeg(mode="CMYK")
    assert libjpeg.decode_jpeg(data) is None  # a colour space the extension leaves to others
    stats = DecodeStats()
    assert torch.equal(decode_rgb(data, stats=stats), pil_rgb(data))
    assert "Corrupt JPEG" not in capfd.readouterr().err  # torchvision printed it
    assert stats.fallback == 1
