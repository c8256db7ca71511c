"""Shared by the GPU-path tests: a small ImageNet-like packed set and a CPU emulation of the
device pipeline (decode on the CPU, then the batched eager resize) for machines without CUDA."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from sample_data.generate import make_imagenet_like
from shardkit.loader.batch import Batch
from shardkit.loader.decode import decode_rgb
from shardkit.loader.gpu_batch import RawImages
from shardkit.loader.pinned import chw_offsets
from shardkit.pack import PackOptions, pack
from shardkit.transforms.gpu import crop_resize_flip_batch


def make_packed_imagenet_like(tmp: Path, classes: int = 2, per_class: int = 40) -> Path:
    src, dst = tmp / "src", tmp / "ds"
    paths = make_imagenet_like(src, classes=classes, per_class=per_class, seed=3, size=(200, 150))
    with Image.open(paths[0]) as im:  # make sure odd files are there: CPU-decoded on the GPU path
        rgb = im.convert("RGB")
    for i, (mode, fmt, ext) in enumerate([("CMYK", "JPEG", "JPEG"), ("L", "JPEG", "JPEG"), ("RGB", "PNG", "png")]):
        rgb.convert(mode).save(paths[0].parent / f"odd_{i}.{ext}", fmt)
    pack(str(src), str(dst), options=PackOptions(max_count=16, seed=1), workers=1)
    return dst


def emulate_device(batch: Batch) -> torch.Tensor:
    """What the GPU pipeline computes for a raw batch, with a CPU decoder and the eager resize."""
    raw = batch.images
    if not isinstance(raw, RawImages):
        raise TypeError(type(raw))
    out = torch.zeros((len(raw), 3, *raw.size), dtype=torch.uint8)
    if raw.cpu_dest.numel():
        out[raw.cpu_dest] = raw.cpu_images
    images = [decode_rgb(bytes(j.numpy())).contiguous().reshape(-1) for j in raw.jpegs()]
    if images:
        crop_resize_flip_batch(torch.cat(images), chw_offsets(raw.geometry), raw.geometry, raw.size,
                               out=out, compile=False)
    return out
