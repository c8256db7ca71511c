"""RandomResizedCropFlip: torchvision's parameter algorithm, drawn from a seeded random.Random."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torchvision.transforms as v1

from shardkit.transforms import CropFlip, RandomResizedCropFlip, imagenet_train
from shardkit.transforms import random_resized_crop_box as box

RATIO = (3 / 4, 4 / 3)


def test_same_seed_same_params_and_different_seed_differs() -> None:
    t = imagenet_train(224)
    a = [t.sample_params(375, 500, r) for r in [random.Random(7)] for _ in range(50)]
    b = [t.sample_params(375, 500, r) for r in [random.Random(7)] for _ in range(50)]
    c = [t.sample_params(375, 500, r) for r in [random.Random(8)] for _ in range(50)]
    assert a == b and a != c
    assert all(isinstance(p, CropFlip) for p in a)


@pytest.mark.parametrize("hw",
                         [(1, 1), (1, 900), (900, 1), (7, 13), (375, 500), (500, 375), (2000, 40)])
def test_params_always_inside_the_image(hw: tuple[int, int]) -> None:
    t, rng = imagenet_train(224), random.Random(0)
    for _ in range(300):
        assert t.sample_params(*hw, rng).inside(*hw)


def test_distribution_matches_torchvision() -> None:
    h, w, n = 375, 500, 4000
    rng = random.Random(0)
    ours = [box(h, w, (0.08, 1.0), RATIO, rng) for _ in range(n)]
    torch.manual_seed(0)
    img = torch.empty(3, h, w)
    theirs = [v1.RandomResizedCrop.get_params(img, [0.08, 1.0], list(RATIO)) for _ in range(n)]

    def stats(boxes: list[tuple[int, int, int, int]]) -> list[float]:
        area = [bh * bw / (h * w) for _, _, bh, bw in boxes]
        logr = [math.log(bw / bh) for _, _, bh, bw in boxes]
        cy = [(t + bh / 2) / h for t, _, bh, _ in boxes]
        cx = [(lf + bw / 2) / w for _, lf, _, bw in boxes]
        return [sum(v) / len(v) for v in (area, logr, cy, cx)]

    for a, b in zip(stats(ours), stats(theirs), strict=True):
        assert abs(a - b) < 0.02, (stats(ours), stats(theirs))


@pytest.mark.parametrize("hw", [(10, 1000), (1000, 10), (300, 300)])
def test_centre_fallback_equals_torchvision(hw: tuple[int, int]) -> None:
    # a scale above 1 never fits, so both take the deterministic fallback after 10 tries
    want = v1.RandomResizedCrop.get_params(torch.empty(3, *hw), [2.0, 3.0], list(RATIO))
    assert box(*hw, (2.0, 3.0), RATIO, random.Random(0)) == tuple(want)


def test_flip_probability() -> None:
    rng = random.Random(3)
    flips = [imagenet_train(224).sample_params(100, 100, rng).flip for _ in range(4000)]
    assert 0.46 < sum(flips) / len(flips) < 0.54
    never = imagenet_train(224, flip_p=0.0)
    assert not any(never.sample_params(100, 100, rng).flip for _ in range(200))


def test_call_is_apply_of_sample_params(photo: torch.Tensor) -> None:
    t = imagenet_train(64)
    p = t.sample_params(photo.shape[1], photo.shape[2], random.Random(5))
    assert torch.equal(t(photo, random.Random(5)), t.apply(photo, p))


@pytest.mark.parametrize("bad", [{"scale": (0.5, 0.1)}, {"ratio": (0.0, 1.0)}, {"flip_p": 1.5}])
def test_invalid_arguments(bad: dict) -> None:
    with pytest.raises(ValueError):
        RandomResizedCropFlip((224, 224), **bad)
