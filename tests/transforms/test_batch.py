"""finalize: normalisation equal to torchvision's, dtype and memory format; presets pickle."""

from __future__ import annotations

import pickle
import random

import pytest
import torch
import torchvision.transforms.v2 as v2

from shardkit.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    BatchFormat,
    imagenet_train,
    imagenet_val,
)
from tests.transforms.images import make_photo


@pytest.fixture
def batch() -> torch.Tensor:
    return torch.stack([make_photo(32, 40, seed=i, hwc=False) for i in range(4)])


def test_default_finalize_is_identity(batch: torch.Tensor) -> None:
    assert imagenet_train(32).finalize(batch) is batch


def test_normalize_matches_torchvision(batch: torch.Tensor) -> None:
    ref = v2.Compose(
        [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )
    got = imagenet_train(32, normalize=True).finalize(batch)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref(batch), atol=1e-5, rtol=1e-5)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    got = imagenet_val(32, normalize=(mean, std)).finalize(batch)
    ref = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    torch.testing.assert_close(got, ref(batch), atol=1e-5, rtol=1e-5)


def test_bfloat16_and_channels_last(batch: torch.Tensor) -> None:
    t = imagenet_train(32, normalize=True, dtype=torch.bfloat16, channels_last=True)
    got = t.finalize(batch)
    assert got.dtype == torch.bfloat16 and got.is_contiguous(memory_format=torch.channels_last)
    want = imagenet_train(32, normalize=True).finalize(batch)
    torch.testing.assert_close(got.float(), want, atol=0.02, rtol=0.01)
    u8 = imagenet_train(32, channels_last=True).finalize(batch)
    assert u8.dtype == torch.uint8 and u8.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(u8, batch)


@pytest.mark.parametrize(
    "kw",
    [
        {"mean": (0.5, 0.5, 0.5)},
        {"mean": (0.5,) * 3, "std": (0.0, 1, 1)},
        {"mean": (0.5,) * 3, "std": (1,) * 3, "dtype": torch.uint8},
    ],
)
def test_invalid_batch_format(kw: dict) -> None:
    with pytest.raises(ValueError):
        BatchFormat(**kw)


@pytest.mark.parametrize(
    "t",
    [
        imagenet_train(64),
        imagenet_train(64, normalize=True, dtype=torch.bfloat16, channels_last=True),
        imagenet_val(64),
    ],
)
def test_pickle_round_trip(t, batch: torch.Tensor) -> None:
    u = pickle.loads(pickle.dumps(t))
    assert u == t
    img = make_photo(120, 150)
    assert torch.equal(u(img, random.Random(3)), t(img, random.Random(3)))
    assert torch.equal(u.finalize(batch), t.finalize(batch))


def test_a_dtype_without_normalize_is_refused_and_the_default_is_what_comes_out() -> None:
    """``dtype=`` did nothing without ``normalize`` (batches stayed uint8, the format said float32)."""
    from shardkit import transforms

    with pytest.raises(ValueError, match="dtype=torch.float32 applies with normalize"):
        transforms.imagenet_val(32, dtype=torch.float32)
    batch = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    plain = transforms.imagenet_train(32)
    assert plain.batch_format.dtype == torch.uint8 and plain.batch_format(batch).dtype == torch.uint8
    assert transforms.imagenet_val(32, normalize=True).batch_format(batch).dtype == torch.float32
    assert transforms.imagenet_val(32, normalize=True, dtype=torch.bfloat16).batch_format(batch).dtype == torch.bfloat16


def test_the_transform_classes_take_an_int_size_as_torchvision_does() -> None:
    from shardkit.transforms import RandomResizedCropFlip, ResizeCenterCrop

    class Mine(RandomResizedCropFlip):
        pass

    # typed (height, width), the form they keep; an int is taken at run time, as torchvision's
    assert Mine(32).output_size == RandomResizedCropFlip((32, 32)).output_size == (32, 32)  # type: ignore[arg-type]
    assert ResizeCenterCrop(24, 32).output_size == (24, 24)  # type: ignore[arg-type]
    import numpy as np

    from shardkit.transforms import imagenet_train

    assert imagenet_train(np.int64(64)).output_size == (64, 64)  # type: ignore[arg-type]  # numpy's ints too
    with pytest.raises(ValueError, match="output_size must be a positive int or \\(height, width\\), got 0"):
        RandomResizedCropFlip(0)  # type: ignore[arg-type]


def test_a_preset_called_without_its_rng_says_how_to_use_it() -> None:
    """Wrapped in a function of the user's (``lambda img: preset(img)``) it failed with "missing 1
    required positional argument: 'rng'", which the docs never mention."""
    from shardkit import transforms

    with pytest.raises(TypeError, match=r"^RandomResizedCropFlip is called by the loader, which gives it each "
                                        r"sample's random.Random and finalises its batches"):
        transforms.imagenet_train(32)(torch.zeros(3, 40, 40, dtype=torch.uint8))
