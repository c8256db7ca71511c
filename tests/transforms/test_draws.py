"""RandomResizedCropFlip's draws from a seed in C (``shardkit.transforms._draws``) against Python's:
``draw(h, w, seed)`` must equal ``sample_params(h, w, random.Random(seed))`` bit for bit, for any
size, seed, scale, ratio and flip probability, the rejection loops and the centre-crop fallback
included."""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest

import shardkit.transforms.random_resized_crop as rrc
from shardkit.transforms import imagenet_train
from shardkit.transforms.params import CropFlip
from shardkit.transforms.random_resized_crop import RandomResizedCropFlip


def _python(t: RandomResizedCropFlip, h: int, w: int, seed: int) -> CropFlip:
    return t.sample_params(h, w, random.Random(seed))


def _c(t: RandomResizedCropFlip, h: int, w: int, seed: int) -> tuple[Any, ...]:
    crop_flip = importlib.import_module("shardkit.transforms._draws").random_resized_crop_flip
    return tuple(crop_flip(h, w, seed, *t.scale, *t.ratio, t.flip_p))


def _as_tuple(p: CropFlip) -> tuple[Any, ...]:
    return p.top, p.left, p.height, p.width, p.flip


def test_the_extension_is_built() -> None:
    # the Makefile and pip install build it; without it draw() seeds a random.Random per image
    t = imagenet_train(224)
    assert _c(t, 375, 500, 0) == _as_tuple(_python(t, 375, 500, 0)) == (3, 5, 372, 432, True)


def test_random_cases_draw_as_python() -> None:
    rng = random.Random(2026)
    for _ in range(30000):
        h, w = (rng.choice([rng.randint(1, 8), rng.randint(1, 700), rng.randint(1, 6000)]) for _ in range(2))
        seed = rng.choice([rng.randrange(2**32), rng.randrange(2**32, 2**64), 0, 2**32 - 1, 2**32, 2**64 - 1])
        lo = rng.choice([0.08, 1.0, rng.uniform(1e-4, 1.0)])
        hi = max(lo, rng.choice([1.0, rng.uniform(lo, 3.0)]))
        rlo = rng.choice([3 / 4, 1.0, rng.uniform(0.05, 3.0)])
        rhi = max(rlo, rng.choice([4 / 3, rng.uniform(0.05, 20.0)]))
        t = RandomResizedCropFlip((32, 32), scale=(lo, hi), ratio=(rlo, rhi), flip_p=rng.choice([0.0, 0.5, 1.0,
                                                                                                   rng.random()]))
        assert _c(t, h, w, seed) == _as_tuple(_python(t, h, w, seed)), (h, w, seed, t)


@pytest.mark.parametrize(("h", "w", "scale", "ratio"), [
    (1, 1, (0.08, 1.0), (3 / 4, 4 / 3)),        # one pixel: tries fail, the fallback's whole image
    (2, 9000, (0.08, 1.0), (3 / 4, 4 / 3)),     # far wider than the ratio: the fallback clamps the width
    (9000, 2, (0.08, 1.0), (3 / 4, 4 / 3)),     # far taller: it clamps the height
    (500, 500, (1.0, 1.0), (1.0, 1.0)),         # the whole image every time: randint over one value
    (375, 500, (0.999, 1.0), (1.33, 1.34)),     # boxes that barely fit
    (3, 3, (0.3, 0.3), (1.0, 1.0)),             # areas that round to halves
])
def test_edge_cases_draw_as_python(h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float]) -> None:
    t = RandomResizedCropFlip((16, 16), scale=scale, ratio=ratio)
    for seed in range(3000):
        assert _c(t, h, w, seed) == _as_tuple(_python(t, h, w, seed)), seed


def test_draw_is_sample_params_of_the_seed_with_and_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    t = imagenet_train(176)
    cases = [(375, 500, 7), (1, 1, 2**63), (4000, 30, 12345678901234)]
    for h, w, seed in cases:
        assert t.draw(h, w, seed) == _python(t, h, w, seed)
    monkeypatch.setattr(rrc, "_crop_flip", None)  # not built
    for h, w, seed in cases:
        assert t.draw(h, w, seed) == _python(t, h, w, seed)


def test_a_seed_the_extension_cannot_take_is_drawn_in_python() -> None:
    t = imagenet_train(176)
    for seed in (2**64, 2**80 + 3, -5):  # random.Random seeds with abs() and any size
        assert t.draw(375, 500, seed) == _python(t, 375, 500, seed)


@pytest.mark.parametrize("settings", [
    {"ratio": (1e-320, 1e-320)},           # boxes of infinite sides: Python raises OverflowError
    {"ratio": (1.0, float("inf"))},
    {"scale": (0.08, float("inf"))},
    {"scale": (0.08, 1e308)},              # finite but past what an int64 holds: Python computes it
])
def test_absurd_settings_are_drawn_in_python(settings: dict[str, Any]) -> None:
    t = RandomResizedCropFlip((8, 8), **settings)
    for seed in range(20):
        try:
            want: object = _python(t, 375, 500, seed)
        except (OverflowError, ValueError) as err:
            want = type(err)
        try:
            got: object = t.draw(375, 500, seed)
        except (OverflowError, ValueError) as err:
            got = type(err)
        assert got == want, seed
    with pytest.raises(OverflowError):
        _c(t, 375, 500, 0)


def test_sides_whose_area_passes_an_int64_draw_as_python() -> None:
    t = imagenet_train(8)
    for seed in range(200):  # no decoder gives such an image; the arithmetic stays Python's
        assert _c(t, 3037000500, 3037000500, seed) == _as_tuple(_python(t, 3037000500, 3037000500, seed))


def test_a_subclass_that_draws_otherwise_keeps_its_draws() -> None:
    class Centred(RandomResizedCropFlip):
        def sample_params(self, height: int, width: int, rng: random.Random) -> CropFlip:
            return CropFlip(0, 0, height, width, rng.random() < 0.5)

    t = Centred((8, 8))
    assert t.draw(30, 40, 3) == t.sample_params(30, 40, random.Random(3))
