"""Bicubic resizing (what most timm pretrained configurations name): the presets' values equal
torchvision's with ``InterpolationMode.BICUBIC``; the GPU routes resize bilinear only, so a CUDA
loader with a bicubic transform takes the CPU route, saying so once."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from shardkit import ShardLoader, transforms
from shardkit.loader.routes.cpu import CpuRoute

BICUBIC = v2.InterpolationMode.BICUBIC


def _image(seed: int, height: int = 75, width: int = 100) -> torch.Tensor:
    return torch.randint(0, 256, (3, height, width), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_val_preset_bicubic_equals_torchvisions() -> None:
    t = transforms.imagenet_val(32, crop_fraction=0.9, interpolation="bicubic")
    for seed in range(5):
        image = _image(seed)
        want = v2.Compose([v2.Resize(35, interpolation=BICUBIC, antialias=True), v2.CenterCrop(32)])(image)
        assert torch.equal(t(image, random.Random(0)), want)
    bilinear = transforms.imagenet_val(32, crop_fraction=0.9)(_image(0), random.Random(0))
    assert not torch.equal(bilinear, t(_image(0), random.Random(0)))  # the filter matters


def test_train_preset_bicubic_equals_torchvisions_resized_crop() -> None:
    t = transforms.imagenet_train(24, interpolation="bicubic")
    for seed in range(5):
        image = _image(seed)
        p = t.sample_params(75, 100, random.Random(seed))
        want = F.resized_crop(image, p.top, p.left, p.height, p.width, [24, 24], interpolation=BICUBIC,
                              antialias=True)
        assert torch.equal(t.apply(image, p), F.horizontal_flip(want) if p.flip else want)


def test_an_unknown_interpolation_is_refused() -> None:
    with pytest.raises(ValueError, match=r"interpolation must be one of \('bilinear', 'bicubic'\), got 'nearest'"):
        transforms.imagenet_train(24, interpolation="nearest")


def test_a_cuda_loader_with_a_bicubic_transform_takes_the_cpu_route(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from sample_data.generate import make_indexed_imagefolder
    from shardkit.pack import PackOptions, pack

    make_indexed_imagefolder(tmp_path / "src", classes=2, per_class=4, size=(40, 32))
    pack(str(tmp_path / "src"), str(tmp_path / "ds"), options=PackOptions(max_count=8), workers=1)
    with caplog.at_level(logging.WARNING, logger="shardkit.loader"):
        loader = ShardLoader(str(tmp_path / "ds"), batch_size=4, device="cuda",
                             transform=transforms.imagenet_train(16, interpolation="bicubic"))
    assert isinstance(loader.route, CpuRoute)
    assert any("resizes bilinear only; bicubic resizing runs on the CPU route" in r.getMessage()
               for r in caplog.records)
    images, _labels = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and images.device == loader.device
