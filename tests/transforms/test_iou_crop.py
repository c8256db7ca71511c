"""IoUCrop draws what torchvision's RandomIoUCrop draws: the same crop (or none) for every seed,
and the generator left in the same state, on random boxes (degenerate, outside the image,
crowded), as a parameter sampler and inside detection_train."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from shardkit.transforms import detection_train, run_detection_transform
from shardkit.transforms.detection import _per_box
from shardkit.transforms.iou_crop import IoUCrop


def _boxes(rng: random.Random, h: int, w: int, k: int) -> torch.Tensor:
    out = []
    for _ in range(k):
        x0, y0 = rng.uniform(-5, w), rng.uniform(-5, h)
        out.append([x0, y0, x0 + rng.uniform(0, w / 2), y0 + rng.uniform(0, h / 2)])
    if out and rng.random() < 0.1:
        out[0] = [3.0, 3.0, 3.0, 9.0]  # zero width
    return torch.tensor(out, dtype=torch.float32).reshape(-1, 4)


def _params(op: v2.RandomIoUCrop, inputs: list[Any]) -> dict[str, Any]:
    make = getattr(op, "make_params", None) or op._get_params  # torchvision < 0.21
    return dict(make(inputs))


def test_same_params_and_generator_state_as_torchvision() -> None:
    rng, ref, fast = random.Random(0), v2.RandomIoUCrop(), IoUCrop()
    for _ in range(600):
        h, w = rng.randint(20, 700), rng.randint(20, 700)
        boxes = tv_tensors.BoundingBoxes(_boxes(rng, h, w, rng.choice([1, 2, 5, 15, 40])), format="XYXY",
                                         canvas_size=(h, w))
        inputs = [tv_tensors.Image(torch.zeros(3, h, w, dtype=torch.uint8)), boxes]
        seed = rng.randrange(2**31)
        torch.manual_seed(seed)
        want, after_want = _params(ref, inputs), torch.rand(3)
        torch.manual_seed(seed)
        got, after_got = _params(fast, inputs), torch.rand(3)
        assert got.keys() == want.keys() and torch.equal(after_got, after_want)
        for k, v in want.items():
            assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v


@pytest.mark.parametrize("seed", range(30))
def test_detection_train_equals_the_torchvision_steps(seed: int) -> None:
    rng = random.Random(seed)
    h, w = rng.randint(60, 200), rng.randint(60, 200)
    n = rng.randint(1, 8)
    image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    target = {"boxes": _boxes(rng, h, w, n).clamp(min=0), "labels": torch.arange(n), "area": torch.rand(n),
              "iscrowd": torch.zeros(n, dtype=torch.int64)}
    ours = detection_train((64, 96), 128)
    assert isinstance(ours.ops[0], IoUCrop)
    theirs = type(ours)([v2.RandomIoUCrop(), *ours.ops[1:-1], v2.SanitizeBoundingBoxes(labels_getter=_per_box)],
                        random=True)
    a_img, a = run_detection_transform(ours, image, dict(target), seed)
    b_img, b = run_detection_transform(theirs, image, dict(target), seed)
    assert torch.equal(a_img, b_img) and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
