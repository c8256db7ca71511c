"""Detection presets: picklable, seeded by the sample seed only, boxes/masks follow the pixels."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from shardkit.transforms import detection_train, detection_val, run_detection_transform


def _sample() -> tuple[torch.Tensor, dict[str, Any]]:
    image = torch.zeros((3, 40, 60), dtype=torch.uint8)
    image[:, 10:20, 5:25] = 255
    masks = torch.zeros((2, 40, 60), dtype=torch.uint8)
    masks[0, 10:20, 5:25] = 1
    masks[1, 30:31, 40:40] = 1  # the second box is degenerate (zero width)
    target = {"boxes": torch.tensor([[5.0, 10, 25, 20], [40, 30, 40, 31]]),
              "labels": torch.tensor([3, 4]), "area": torch.tensor([200.0, 0.0]),
              "iscrowd": torch.tensor([0, 0]), "masks": masks, "image_id": 7}
    return image, target


def test_pickles_and_is_seeded() -> None:
    t = pickle.loads(pickle.dumps(detection_train(32, 64, scale_jitter=(0.5, 1.5))))
    image, target = _sample()
    a = run_detection_transform(t, image, target, seed=4)
    b = run_detection_transform(t, image, target, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["boxes"], b[1]["boxes"])
    assert (a[1]["image_id"] == 7 and type(a[0]) is torch.Tensor
            and type(a[1]["boxes"]) is torch.Tensor)


def test_flip_and_resize_move_boxes_masks_and_pixels() -> None:
    image, target = _sample()
    t = detection_train(80, 1000, flip_p=1.0, iou_crop=False)  # 40x60 -> 80x120, mirrored
    out, tgt = run_detection_transform(t, image, target, seed=0)
    assert out.shape == (3, 80, 120)
    # the degenerate box went with its label, area, iscrowd and mask
    assert (tgt["labels"].tolist() == [3] and tgt["area"].tolist() == [200.0]
            and tgt["masks"].shape == (1, 80, 120))
    assert tgt["boxes"].tolist() == [[70.0, 20.0, 110.0, 40.0]]
    ys, xs = tgt["masks"][0].nonzero(as_tuple=True)
    assert (int(xs.min()), int(xs.max()) + 1, int(ys.min()), int(ys.max()) + 1) == (70, 110, 20, 40)
    assert int(out[0, 25:35, 75:105].min()) > 200 and int(out[0, 25:35, 10:60].max()) < 50


def test_val_is_identity_without_resize_and_resizes_with_it() -> None:
    image, target = _sample()
    out, tgt = run_detection_transform(detection_val(), image, target, seed=0)
    assert (torch.equal(out, image) and torch.equal(tgt["boxes"], target["boxes"])
            and len(tgt["labels"]) == 2)
    out, tgt = run_detection_transform(detection_val(20), image, target, seed=0)
    assert out.shape == (3, 20, 30) and tgt["boxes"][0].tolist() == [2.5, 5.0, 12.5, 10.0]


@pytest.mark.parametrize("kwargs", [{"min_size": 0}, {"flip_p": 2.0}, {"scale_jitter": (2.0, 1.0)}])
def test_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        detection_train(**kwargs)  # type: ignore[arg-type]


def test_the_lazy_detection_names_are_listed_without_being_imported() -> None:
    import subprocess
    import sys

    code = ("import sys; from shardkit import transforms; names = dir(transforms); "
            "print(all(n in names for n in transforms.__all__), 'shardkit.transforms.detection' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"]  # listed for tab completion, still imported on first use
