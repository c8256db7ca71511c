"""The batched crop-resize-flip: eager reference vs torch/torchvision resize on the CPU, the
Triton kernel (interpreted on the CPU, compiled on CUDA) vs the eager reference."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from shardkit import transforms
from shardkit.transforms.gpu import crop_resize_flip_batch, geometry_rows
from shardkit.transforms.params import CropFlip
from tests.transforms.interpreted import run_interpreted

SIZES = [(60, 80), (97, 41), (30, 30), (120, 90), (300, 400)]


def _batch(
    out: int, seed: int = 0
) -> tuple[list[torch.Tensor], list[CropFlip], torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    imgs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in SIZES]
    t, rng = transforms.imagenet_train(out), random.Random(seed)
    params = [t.sample_params(h, w, rng) for h, w in SIZES]
    params[2] = CropFlip(3, 4, 10, 12, True)  # upsampling, flipped
    flat = torch.cat([i.reshape(-1) for i in imgs])
    offsets = torch.tensor([0] + [i.numel() for i in imgs]).cumsum(0)[:-1]
    return imgs, params, flat, offsets, geometry_rows(SIZES, params, (out, out))


def test_eager_matches_torch_float_resize_and_cpu_uint8_path() -> None:
    imgs, params, flat, offsets, geom = _batch(24)
    out = crop_resize_flip_batch(flat, offsets, geom, (24, 24), compile=False)
    for img, p, got in zip(imgs, params, out, strict=True):
        crop = img[:, p.top : p.top + p.height, p.left : p.left + p.width]
        ref = F.interpolate(
            crop[None].float(), size=(24, 24), mode="bilinear", antialias=True, align_corners=False
        )[0]
        ref = ref.flip(-1) if p.flip else ref
        assert (got.float() - ref.clamp(0, 255)).abs().max() <= 0.5 + 1e-3
        v2 = (
            TF.horizontal_flip(
                TF.resized_crop(img, p.top, p.left, p.height, p.width, [24, 24], antialias=True)
            )
            if p.flip
            else TF.resized_crop(img, p.top, p.left, p.height, p.width, [24, 24], antialias=True)
        )  # noqa: E501
        assert (got.int() - v2.int()).abs().max() <= 1  # v2 on uint8 rounds after each pass


def test_center_crop_window_matches_resize_then_crop() -> None:
    t = transforms.imagenet_val(64)
    g = torch.Generator().manual_seed(1)
    for h, w in [(150, 200), (201, 130), (73, 73)]:
        img = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        params = t.sample_params(h, w, random.Random(0))
        geom = torch.tensor([[*t.gpu_window(h, w, params), 0]], dtype=torch.int32)
        got = crop_resize_flip_batch(
            img.reshape(-1), torch.tensor([0]), geom, (64, 64), compile=False
        )[0]
        want = TF.center_crop(TF.resize(img, [t.resize_to], antialias=True), [64, 64])
        assert (got.int() - want.int()).abs().max() <= 1


def test_dest_rows_and_untouched_rows() -> None:
    _, params, flat, offsets, _ = _batch(16)
    geom = geometry_rows(SIZES, params, (16, 16), dests=[5, 3, 1, 0, 6])
    out = torch.full((7, 3, 16, 16), 7, dtype=torch.uint8)
    crop_resize_flip_batch(flat, offsets, geom, (16, 16), out=out, compile=False)
    ref = crop_resize_flip_batch(
        flat, offsets, geometry_rows(SIZES, params, (16, 16)), (16, 16), compile=False
    )
    assert torch.equal(out[5], ref[0]) and torch.equal(out[6], ref[4])
    assert bool((out[2] == 7).all()) and bool((out[4] == 7).all())


def test_rejects_bad_arguments() -> None:
    _, _, flat, offsets, geom = _batch(8)
    with pytest.raises(ValueError):
        crop_resize_flip_batch(flat.float(), offsets, geom, (8, 8))
    with pytest.raises(ValueError):
        crop_resize_flip_batch(flat, offsets[:2], geom, (8, 8))
    with pytest.raises(ValueError):
        crop_resize_flip_batch(flat, offsets, geom.long(), (8, 8))


def test_triton_kernel_interpreted_on_cpu_matches_eager() -> None:
    out = run_interpreted(
        "import torch\n"
        "from tests.transforms.test_gpu_resize import _batch\n"
        "from shardkit.transforms import gpu_kernel\n"
        "from shardkit.transforms.gpu import crop_resize_flip_batch\n"
        "_, _, flat, offsets, geom = _batch(20, seed=4)\n"
        "ref = crop_resize_flip_batch(flat, offsets, geom, (20, 20), compile=False)\n"
        "out = torch.zeros_like(ref)\n"
        "gpu_kernel.launch(flat, offsets, geom, out)\n"
        "print((out.int() - ref.int()).abs().max().item())\n"
    )
    assert int(out.split()[-1]) <= 1  # float32 kernel vs float64 tap positions


@pytest.mark.cuda
def test_compiled_kernel_matches_eager_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _, _, flat, offsets, geom = _batch(224, seed=2)
    flat, offsets, geom = flat.cuda(), offsets.cuda(), geom.cuda()
    eager = crop_resize_flip_batch(flat, offsets, geom, (224, 224), compile=False)
    compiled = crop_resize_flip_batch(flat, offsets, geom, (224, 224), compile=True)
    diff = (eager.int() - compiled.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.01


@pytest.mark.cuda
def test_a_kernel_compiled_ahead_is_the_one_the_first_batch_launches(tmp_path: Path) -> None:
    """warm_up compiles in a thread; the first real launch of that size waits for it and adds no
    compile of its own (Triton's cache, empty at the start, holds the same entries after it).
    The same for the COCO route's ragged kernel."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    script = (
        "import os, torch\n"
        "from shardkit.transforms import gpu_ahead, gpu_kernel\n"
        "from shardkit.transforms.gpu import crop_resize_flip_batch\n"
        "from tests.transforms.test_gpu_resize import _batch\n"
        "gpu_kernel.warm_up((40, 40), torch.device('cuda'))\n"
        "gpu_ahead.wait(('resize', torch.cuda.current_device(), 40, 40))\n"
        "ahead = sorted(os.listdir(os.environ['TRITON_CACHE_DIR']))\n"
        "_, _, flat, offsets, geom = _batch(40, seed=3)\n"
        "flat, offsets, geom = flat.cuda(), offsets.cuda(), geom.cuda()\n"
        "got = crop_resize_flip_batch(flat, offsets, geom, (40, 40))\n"
        "ref = crop_resize_flip_batch(flat, offsets, geom, (40, 40), compile=False)\n"
        "after = sorted(os.listdir(os.environ['TRITON_CACHE_DIR']))\n"
        "from shardkit.transforms import gpu_ragged_kernel\n"
        "from tests.transforms.test_gpu_ragged import _kernel_vs_eager\n"
        "gpu_ragged_kernel.warm_up(torch.device('cuda'))\n"
        "gpu_ahead.wait(('ragged', torch.cuda.current_device()))\n"
        "ragged = sorted(os.listdir(os.environ['TRITON_CACHE_DIR']))\n"
        "ragged_diff = _kernel_vs_eager('cuda', 0)\n"
        "print(len(ahead), ahead == after, int((got.int() - ref.int()).abs().max()), len(ragged) > len(after),\n"
        "      ragged == sorted(os.listdir(os.environ['TRITON_CACHE_DIR'])), ragged_diff)\n"
    )
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    entries, same, diff, ragged_compiled, ragged_same, ragged_diff = done.stdout.split()
    assert int(entries) > 0 and same == "True" and int(diff) <= 1
    assert ragged_compiled == ragged_same == "True" and int(ragged_diff) <= 1  # the COCO route's kernel, likewise
