"""Crop-resize-flip to a size per image: the eager reference against the one-size batch and
``pad_images``, the Triton kernel (interpreted on the CPU, compiled on CUDA) against the eager one."""

from __future__ import annotations

import random

import pytest
import torch

from shardkit.loader.routes.coco.worker import pad_images
from shardkit.loader.routes.device.pinned import chw_offsets
from shardkit.transforms.gpu import crop_resize_flip_batch, geometry_rows, window_geometry
from shardkit.transforms.gpu_ragged import crop_resize_flip_ragged, ragged_images, ragged_layout
from shardkit.transforms.params import CropFlip
from tests.transforms.interpreted import run_interpreted


def _batch(seed: int, n: int = 6, largest: int = 120
           ) -> tuple[list[torch.Tensor], list[CropFlip], list[tuple[int, int]], torch.Tensor]:
    """Images, boxes, output sizes (down and up, sides up to ``largest``), geometry rows with
    ``dest`` a permutation."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    images, boxes, sizes, rows = [], [], [], []
    dests = list(range(n))
    rng.shuffle(dests)
    for i in range(n):
        h, w = rng.randint(20, 90), rng.randint(20, 90)
        images.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g))
        bh, bw = rng.randint(4, h), rng.randint(4, w)
        boxes.append(CropFlip(rng.randint(0, h - bh), rng.randint(0, w - bw), bh, bw, rng.random() < 0.5))
        sizes.append((rng.randint(6, largest), rng.randint(6, largest)))
        rows.append((*window_geometry(h, w, boxes[i], sizes[i]), dests[i]))
    return images, boxes, sizes, torch.tensor(rows, dtype=torch.int32)


def _by_dest(geom: torch.Tensor, sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = [(0, 0)] * len(sizes)
    for row, size in zip(geom.tolist(), sizes, strict=True):
        out[row[-1]] = size
    return out


@pytest.mark.parametrize("pad", [0, 1, 16])
def test_eager_equals_one_size_batches_placed_like_pad_images(pad: int) -> None:
    images, boxes, sizes, geom = _batch(3)
    flat = torch.cat([im.reshape(-1) for im in images])
    placed = _by_dest(geom, sizes)
    places, shape = ragged_layout(placed, pad)
    out = torch.full(shape, 7, dtype=torch.uint8) if not pad else torch.zeros(shape, dtype=torch.uint8)
    crop_resize_flip_ragged(flat, chw_offsets(geom), geom, out, places, compile=False)
    want = [torch.empty(0)] * len(images)
    for im, box, size, row in zip(images, boxes, sizes, geom.tolist(), strict=True):
        row_geom = geometry_rows([(im.shape[1], im.shape[2])], [box], size)
        one = crop_resize_flip_batch(im.reshape(-1), torch.tensor([0]), row_geom, size, compile=False)[0]
        want[row[-1]] = one
    if pad:
        ref = pad_images(want, pad)
        assert tuple(ref.images.shape) == shape and torch.equal(out, ref.images)
    else:
        got = ragged_images(out, places, placed)
        assert all(g.is_contiguous() and torch.equal(g, w) for g, w in zip(got, want, strict=True))
        assert out.numel() == sum(w.numel() for w in want)


def test_rows_not_named_are_left_alone() -> None:
    images, _, sizes, geom = _batch(5, n=3)
    keep = geom[geom[:, -1] != 1]  # output 1 comes from elsewhere (an image decoded on the CPU)
    flat = torch.cat([im.reshape(-1) for im, row in zip(images, geom.tolist(), strict=True) if row[-1] != 1])
    places, shape = ragged_layout(_by_dest(geom, sizes), 0)
    out = torch.full(shape, 99, dtype=torch.uint8)
    crop_resize_flip_ragged(flat, chw_offsets(keep), keep, out, places, compile=False)
    untouched = ragged_images(out, places, _by_dest(geom, sizes))[1]
    assert bool((untouched == 99).all())


def test_layout_and_bad_arguments() -> None:
    assert ragged_layout([], 0)[1] == (0,) and ragged_layout([], 8)[1] == (0, 3, 0, 0)
    with pytest.raises(ValueError, match="pad"):
        ragged_layout([(2, 2)], -1)
    images, _, sizes, geom = _batch(1, n=2)
    flat = torch.cat([im.reshape(-1) for im in images])
    places, shape = ragged_layout(_by_dest(geom, sizes), 0)
    with pytest.raises(ValueError, match="places"):
        crop_resize_flip_ragged(flat, chw_offsets(geom), geom, torch.empty(shape, dtype=torch.uint8),
                                places.int(), compile=False)
    shifted = geom.clone()
    shifted[0, 8] = 1  # off_y: a window inside the resize is not a ragged output
    with pytest.raises(ValueError, match="offsets must be 0"):
        crop_resize_flip_ragged(flat, chw_offsets(geom), shifted, torch.empty(shape, dtype=torch.uint8), places,
                                compile=False)


def _kernel_vs_eager(device: str, pad: int, largest: int = 120) -> int:
    images, _, sizes, geom = _batch(11, largest=largest)
    flat = torch.cat([im.reshape(-1) for im in images]).to(device)
    places, shape = ragged_layout(_by_dest(geom, sizes), pad)
    offsets, geom_d, places_d = chw_offsets(geom).to(device), geom.to(device), places.to(device)
    ref = torch.zeros(shape, dtype=torch.uint8, device=device)
    crop_resize_flip_ragged(flat, offsets, geom_d, ref, places_d, compile=False)
    out = torch.zeros(shape, dtype=torch.uint8, device=device)
    from shardkit.transforms import gpu_ragged_kernel

    gpu_ragged_kernel.launch(flat, offsets, geom_d, out, places_d, max(h * w for h, w in sizes))
    return int((out.int() - ref.int()).abs().max())


def test_triton_kernel_interpreted_on_cpu_matches_eager() -> None:
    out = run_interpreted("from tests.transforms.test_gpu_ragged import _kernel_vs_eager\n"
                          "print(max(_kernel_vs_eager('cpu', pad, largest=40) for pad in (0, 8)))\n")
    assert int(out.split()[-1]) <= 1  # float32 kernel vs float64 tap positions


@pytest.mark.cuda
@pytest.mark.parametrize("pad", [0, 32])
def test_compiled_kernel_matches_eager_on_cuda(pad: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert _kernel_vs_eager("cuda", pad) <= 1
