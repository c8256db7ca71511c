"""crop_resize_flip equals torchvision's resized_crop (+ flip), writes into out in place."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
import torchvision.transforms.v2.functional as F

from shardkit.transforms import CropFlip, crop_resize_flip, imagenet_train, ops
from tests.transforms.images import make_photo


def reference(img: torch.Tensor, p: CropFlip, size: tuple[int, int]) -> torch.Tensor:
    out = F.resized_crop(img, p.top, p.left, p.height, p.width, list(size), antialias=True)
    return F.horizontal_flip(out) if p.flip else out


@pytest.mark.parametrize("hwc", [True, False])
def test_equals_torchvision_resized_crop_and_flip(hwc: bool) -> None:
    img, t, rng = make_photo(187, 251, hwc=hwc), imagenet_train(96), random.Random(0)
    for _ in range(40):
        p = t.sample_params(187, 251, rng)
        got = t.apply(img, p)
        assert got.shape == (3, 96, 96) and got.dtype == torch.uint8
        assert torch.equal(got, reference(img, p, (96, 96)))


def test_flip_mirrors_columns(photo: torch.Tensor) -> None:
    p = CropFlip(10, 20, 50, 60, flip=True)
    got = crop_resize_flip(photo, p, (50, 60))  # no resize: an exact crop, mirrored
    assert torch.equal(got, photo[:, 10:60, 20:80].flip(-1))
    unflipped = crop_resize_flip(photo, CropFlip(10, 20, 70, 90), (32, 40))
    assert torch.equal(crop_resize_flip(photo, CropFlip(10, 20, 70, 90, True), (32, 40)),
                       unflipped.flip(-1))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("flip", [False, True])
def test_out_is_written_in_place(photo: torch.Tensor, channels_last: bool, flip: bool) -> None:
    batch = torch.zeros(4, 3, 48, 40, dtype=torch.uint8)
    if channels_last:
        batch = batch.contiguous(memory_format=torch.channels_last)
    ptr = batch.data_ptr()
    p = CropFlip(5, 7, 100, 90, flip)
    ret = crop_resize_flip(photo, p, (48, 40), out=batch[2])
    assert ret.data_ptr() == batch[2].data_ptr() and batch.data_ptr() == ptr
    assert torch.equal(batch[2], reference(photo, p, (48, 40)))
    assert batch[[0, 1, 3]].sum() == 0


def test_result_does_not_alias_the_input(photo: torch.Tensor) -> None:
    got = crop_resize_flip(photo, CropFlip(0, 0, 30, 30), (30, 30))
    got.fill_(0)
    assert photo[:, :30, :30].sum() > 0


@pytest.mark.parametrize(
    "img, p, out",
    [
        (make_photo(50, 50), CropFlip(0, 0, 51, 10), None),  # box outside
        (make_photo(50, 50), CropFlip(-1, 0, 10, 10), None),
        (make_photo(50, 50), CropFlip(0, 0, 0, 10), None),  # empty box
        (make_photo(50, 50).float(), CropFlip(0, 0, 10, 10), None),  # not uint8
        (make_photo(50, 50), CropFlip(0, 0, 10, 10), torch.empty(3, 9, 9, dtype=torch.uint8)),
    ],
)
def test_invalid_inputs_raise(img: torch.Tensor, p: CropFlip, out: torch.Tensor | None) -> None:
    with pytest.raises(ValueError):
        crop_resize_flip(img, p, (16, 16), out)


def test_planar_extension_is_built_where_a_c_compiler_exists() -> None:
    if shutil.which("cc") or shutil.which("gcc"):
        assert ops.hwc_to_chw is not None, ("a C compiler is here but shardkit.transforms._planar "
                                            "was not built")


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("size", [(224, 224), (1, 1), (7, 33), (33, 7)])
def test_c_repacking_equals_numpy(flip: bool, size: tuple[int, int],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    hwc = torch.randint(0, 256, (*size, 3), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(0))
    res = hwc.permute(2, 0, 1)  # [3, H, W] with HWC memory, as the resize kernel returns it
    expected = res.flip(-1) if flip else res
    got = ops._write(torch.empty(3, *size, dtype=torch.uint8), res, flip)
    assert torch.equal(got, expected)
    monkeypatch.setattr(ops, "hwc_to_chw", None)
    assert torch.equal(ops._write(torch.empty(3, *size, dtype=torch.uint8), res, flip), expected)


@pytest.mark.skipif(ops.hwc_to_chw is None, reason="repacking extension not built")
def test_c_repacking_refuses_short_buffers() -> None:
    repack = ops.hwc_to_chw
    assert repack is not None
    src = torch.zeros(4 * 5 * 3, dtype=torch.uint8).numpy()
    with pytest.raises(ValueError, match="height\\*width\\*3"):
        repack(src, torch.zeros(59, dtype=torch.uint8).numpy(), 4, 5, False)
    with pytest.raises(ValueError):
        repack(src[:-1], torch.zeros(60, dtype=torch.uint8).numpy(), 4, 5, False)
    with pytest.raises(ValueError):
        repack(src, torch.zeros(60, dtype=torch.uint8).numpy(), -1, 5, False)
