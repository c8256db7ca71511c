"""Batch augmentations on uint8 batches against torchvision's own (per image): RandomErasing's
box distribution, ColorJitter's arithmetic and factor distribution; and the augmentations users
already have that take a ShardLoader batch as it is (timm's Mixup/CutMix, torchvision's
TrivialAugmentWide/RandAugment per image)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from shardkit.transforms.color import ColorJitter, adjust_brightness, adjust_contrast, adjust_saturation
from shardkit.transforms.erasing import RandomErasing, erasing_boxes

H, W = 24, 32


def _box_stats(boxes: torch.Tensor) -> tuple[float, float, float]:
    """(fraction erased, mean erased area fraction, mean log aspect h/w) of ``(top, left, h, w)`` rows."""
    on = boxes[boxes[:, 2] > 0].double()
    area = float((on[:, 2] * on[:, 3]).mean() / (H * W))
    return len(on) / len(boxes), area, float((on[:, 2] / on[:, 3]).log().mean())


def _torchvision_boxes(n: int, p: float) -> torch.Tensor:
    torch.manual_seed(0)
    eraser = v2.RandomErasing(p=p, value=0)
    rows = []
    for _ in range(n):
        out = eraser(torch.full((3, H, W), 255, dtype=torch.uint8))
        zero = (out[0] == 0).nonzero()
        if len(zero):
            (t, left), (b, r) = zero.min(0).values.tolist(), zero.max(0).values.tolist()
            rows.append([t, left, b - t + 1, r - left + 1])
        else:
            rows.append([0, 0, 0, 0])
    return torch.tensor(rows)


def test_random_erasing_boxes_follow_torchvisions_distribution() -> None:
    n = 3000
    ours = erasing_boxes(n, H, W, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3),
                         generator=torch.Generator().manual_seed(1))
    theirs = _torchvision_boxes(n, 0.5)
    (p1, a1, r1), (p2, a2, r2) = _box_stats(ours), _box_stats(theirs)
    assert abs(p1 - p2) < 4 * math.sqrt(0.25 / n) * math.sqrt(2)  # erased fraction, both ~0.5
    assert abs(a1 - a2) < 0.012 and abs(r1 - r2) < 0.08  # area fraction ~0.14 (sd ~0.08), log aspect (sd ~0.6)
    on = ours[ours[:, 2] > 0]
    assert bool(((on[:, 0] + on[:, 2] <= H) & (on[:, 1] + on[:, 3] <= W)).all())  # inside the image
    assert bool((on[:, 2] < H).all() and (on[:, 3] < W).all())  # torchvision's strict fit


def test_random_erasing_erases_only_its_boxes_on_a_batch() -> None:
    x = torch.randint(1, 256, (64, 3, H, W), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    y = RandomErasing(p=1.0, value=(0, 0, 0))(x, torch.Generator().manual_seed(2))
    boxes = erasing_boxes(64, H, W, p=1.0, scale=(0.02, 0.33), ratio=(0.3, 3.3),
                          generator=torch.Generator().manual_seed(2))
    for i, (t, left, h, w) in enumerate(boxes.tolist()):
        inside = torch.zeros(H, W, dtype=torch.bool)
        inside[t:t + h, left:left + w] = True
        assert bool((y[i][:, inside] == 0).all()) and torch.equal(y[i][:, ~inside], x[i][:, ~inside])
    assert bool((x > 0).all())  # the input is left as it is
    noisy = RandomErasing(p=1.0, value="random")(x, torch.Generator().manual_seed(2))
    assert noisy.dtype == torch.uint8 and not torch.equal(noisy, x)
    with pytest.raises(ValueError, match="value must be an int in"):
        RandomErasing(value=300)


@pytest.mark.parametrize("ours,theirs", [(adjust_brightness, F.adjust_brightness),
                                         (adjust_contrast, F.adjust_contrast),
                                         (adjust_saturation, F.adjust_saturation)])
def test_color_ops_equal_torchvisions_per_image(ours, theirs) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (32, 3, H, W), generator=g, dtype=torch.uint8)
    factor = torch.empty(32).uniform_(0.5, 1.5, generator=g)
    got = ours(x, factor)
    want = torch.stack([theirs(x[i], float(factor[i])) for i in range(32)])
    diff = (got.int() - want.int()).abs()
    assert int(diff.max()) <= 1 and int((diff > 0).sum()) <= diff.numel() // 1000


def test_color_jitter_draws_torchvisions_factors_and_orders_per_image() -> None:
    jitter = ColorJitter(brightness=0.4, contrast=(0.5, 1.0), saturation=0.2)
    factors, order = jitter.draw(4000, torch.Generator().manual_seed(0))
    lo, hi = factors.min(0).values.tolist(), factors.max(0).values.tolist()
    assert lo[0] >= 0.6 and hi[0] <= 1.4 and lo[1] >= 0.5 and hi[1] <= 1.0 and lo[2] >= 0.8 and hi[2] <= 1.2
    assert factors.mean(0).tolist() == pytest.approx([1.0, 0.75, 1.0], abs=0.02)  # uniform, as v2.ColorJitter
    perms = torch.unique(order, dim=0, return_counts=True)[1]
    assert len(perms) == 6 and int(perms.min()) > 600  # every order, about equally often


def test_color_jitter_applies_each_images_factors_in_its_order() -> None:
    jitter = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4)
    x = torch.randint(0, 256, (16, 3, H, W), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    got = jitter(x, torch.Generator().manual_seed(4))
    factors, order = jitter.draw(16, torch.Generator().manual_seed(4))
    ops = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation)
    for i in range(16):
        want = x[i]
        for op in order[i].tolist():
            want = ops[op](want, float(factors[i, op]))
        assert int((got[i].int() - want.int()).abs().max()) <= 1


def test_timm_mixup_and_cutmix_take_a_loader_batch() -> None:
    timm_mixup = pytest.importorskip("timm.data").Mixup
    images = torch.rand(8, 3, H, W)  # a normalised batch as the loader finalises it
    labels = torch.arange(8) % 4
    mixed, soft = timm_mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=4)(images, labels)
    assert mixed.shape == images.shape and soft.shape == (8, 4) and torch.allclose(soft.sum(1), torch.ones(8))
    mixed, soft = v2.CutMix(num_classes=4)(images, labels)  # torchvision's works on the batch too
    assert soft.shape == (8, 4)


def test_trivial_augment_and_randaugment_run_per_image_on_a_uint8_batch() -> None:
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (4, 3, H, W), dtype=torch.uint8)
    for augment in (v2.TrivialAugmentWide(), v2.RandAugment(num_ops=2, magnitude=9)):
        out = torch.stack([augment(image) for image in batch])  # torchvision's take uint8 tensors, any device
        assert out.shape == batch.shape and out.dtype == torch.uint8
    timm_aa = pytest.importorskip("timm.data.auto_augment")
    random.seed(0)  # timm draws its ops from Python's random
    with pytest.raises((AttributeError, OSError, TypeError, ValueError)):  # timm needs PIL images; errors vary
        ops = timm_aa.rand_augment_transform("rand-m9-n2-mstd0.5", {})
        for _ in range(20):
            ops(batch[0])


def test_the_augment_recipe_runs_on_loader_batches(tmp_path: Path) -> None:
    pytest.importorskip("timm")
    from pipelines.augment_recipe import augmented_batches
    from sample_data.generate import make_indexed_imagefolder
    from shardkit.pack import PackOptions, pack

    make_indexed_imagefolder(tmp_path / "src", classes=2, per_class=8, size=(40, 32))
    pack(str(tmp_path / "src"), str(tmp_path / "ds"), options=PackOptions(max_count=8), workers=1)
    batches = list(augmented_batches(str(tmp_path / "ds"), size=16, batch_size=4, num_classes=2))
    assert len(batches) == 4
    images, targets = batches[0]
    assert images.dtype == torch.float32 and images.shape == (4, 3, 16, 16) and targets.shape == (4, 2)


def test_the_augment_recipe_takes_the_datasets_classes_and_refuses_what_cannot_run(tmp_path: Path) -> None:
    """It built [256, 1000] targets for 2 classes, ran a raw timm error at --classes 1, and did
    nothing on a data set smaller than a batch."""
    pytest.importorskip("timm")
    from pipelines.augment_recipe import augmented_batches
    from sample_data.generate import make_indexed_imagefolder
    from shardkit.pack import PackOptions, pack

    make_indexed_imagefolder(tmp_path / "src", classes=3, per_class=4, size=(40, 32))
    pack(str(tmp_path / "src"), str(tmp_path / "ds"), options=PackOptions(max_count=8), workers=1)
    ds = str(tmp_path / "ds")
    _, targets = next(augmented_batches(ds, size=16, batch_size=4))
    assert targets.shape == (4, 3)
    for kwargs, message in (({"batch_size": 3}, "batch size 3 is odd"),
                            ({"batch_size": 4, "num_classes": 2}, "has 3 classes, more than the 2 given"),
                            ({"batch_size": 14}, "make no full batch of 14")):
        with pytest.raises(ValueError, match=message):
            next(augmented_batches(ds, size=16, **kwargs))
