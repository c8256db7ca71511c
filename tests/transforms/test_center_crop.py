"""imagenet_val equals torchvision Resize(size / 0.875) + CenterCrop(size) on photos."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torchvision.transforms.v2 as v2

from shardkit.codec.decode import decode_rgb
from shardkit.transforms import CropFlip, imagenet_val, resize_center_crop_box
from tests.transforms.images import make_photo

# Real photos shipped with the repository (scikit-image's data set, see sample_data/README.md).
REAL = sorted((Path(__file__).resolve().parents[2] / "sample_data" / "photos").glob("*.jpg"))
PHOTOS = [f"synthetic-{h}x{w}" for h, w in [(375, 500), (500, 375), (333, 333), (200, 900)]]
PHOTOS += [p.name for p in REAL]


def load(name: str) -> torch.Tensor:
    if name.startswith("synthetic-"):
        h, w = map(int, name.split("-")[1].split("x"))
        return make_photo(h, w, seed=h)
    return decode_rgb(next(p for p in REAL if p.name == name).read_bytes())


@pytest.mark.parametrize("name", PHOTOS)
def test_matches_torchvision_within_one_level(name: str) -> None:
    img = load(name)
    want = v2.Compose([v2.Resize(256), v2.CenterCrop(224)])(img)
    got = imagenet_val(224)(img, random.Random(0))
    assert got.shape == want.shape == (3, 224, 224)
    assert (got.int() - want.int()).abs().float().mean() <= 1.0  # measured: 0 (same kernel)


def test_box_covers_the_centre_crop_and_ignores_rng() -> None:
    t = imagenet_val(224)
    p = t.sample_params(375, 500, random.Random(1))
    assert p == t.sample_params(375, 500, random.Random(2)) and not p.flip
    # 375x500 -> 256x341; the 224 crop starts at (16, 58) there: x 375/256 and 500/341 here
    assert p == CropFlip(23, 85, 329, 328)
    for hw in [(1, 1), (10, 4000), (4000, 10), (224, 224), (257, 256)]:
        assert CropFlip(*resize_center_crop_box(*hw, 256, (224, 224))).inside(*hw)


def test_other_boxes_take_the_generic_path() -> None:
    img, t = make_photo(300, 400), imagenet_val(64)
    p = CropFlip(0, 0, 100, 100, flip=True)
    assert torch.equal(t.apply(img, p),
                       v2.functional.resized_crop(img, 0, 0, 100, 100, [64, 64]).flip(-1))


def test_out_is_written_in_place() -> None:
    img, t = make_photo(300, 400), imagenet_val(224)
    out = torch.zeros(3, 224, 224, dtype=torch.uint8)
    ret = t.apply(img, t.sample_params(300, 400, random.Random(0)), out=out)
    assert ret.data_ptr() == out.data_ptr() and torch.equal(out, t(img, random.Random(0)))


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        imagenet_val(224, crop_fraction=1.5)


def test_draw_is_the_centre_box_whatever_the_seed() -> None:
    from shardkit.transforms.center_crop import ResizeCenterCrop

    t = ResizeCenterCrop((224, 224), 256)
    for seed in (0, 7, 2**64 - 1):
        assert t.draw(375, 500, seed) == t.sample_params(375, 500, random.Random(seed))

    class Jittered(ResizeCenterCrop):  # a subclass that draws keeps its draws
        def sample_params(self, height: int, width: int, rng: random.Random) -> CropFlip:
            return CropFlip(rng.randint(0, 3), 0, 8, 8)

    j = Jittered((8, 8), 10)
    assert j.draw(40, 40, 3) == j.sample_params(40, 40, random.Random(3))
