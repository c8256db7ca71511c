"""Shared by the GPU-path tests: a small ImageNet-like packed set, one pass of a loader on it
(:func:`batches_on_cpu`), and a CPU emulation of the device pipeline (decode on the CPU, then the
batched eager resize) for machines without CUDA."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from sample_data.generate import make_imagenet_like
from shardkit import ShardLoader
from shardkit.codec import jpeg_restart
from shardkit.codec.decode import decode_rgb
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.cpu.worker import CpuBatch, CpuBatchBuilder
from shardkit.loader.routes.device.payload import RawImages, StagedBatch
from shardkit.loader.routes.device.pinned import PinnedSlot, chw_offsets
from shardkit.loader.routes.gpu.host import DeviceBatch
from shardkit.loader.routes.gpu.worker import RawBatch, RawBatchBuilder
from shardkit.loader.run.stream import BatchStream, raise_failures
from shardkit.pack import PackOptions, pack
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS, crop_resize_flip_batch


def make_packed_imagenet_like(tmp: Path, classes: int = 2, per_class: int = 40, *, restart: bool = False) -> Path:
    """``restart``: store the JPEGs restart-indexed (what ``pack --jpeg-restart`` stores)."""
    src, dst = tmp / "src", tmp / "ds"
    paths = make_imagenet_like(src, classes=classes, per_class=per_class, seed=3, size=(200, 150))
    with Image.open(paths[0]) as im:  # make sure odd files are there: CPU-decoded on the GPU path
        rgb = im.convert("RGB")
    for i, (mode, fmt, ext) in enumerate([("CMYK", "JPEG", "JPEG"), ("L", "JPEG", "JPEG"), ("RGB", "PNG", "png")]):
        rgb.convert(mode).save(paths[0].parent / f"odd_{i}.{ext}", fmt)
    if restart:
        for path in src.rglob("*"):
            data = path.read_bytes() if path.is_file() else b""
            if data.startswith(b"\xff\xd8\xff"):
                path.write_bytes(jpeg_restart.transcode(data, 2) or data)
    pack(str(src), str(dst), options=PackOptions(max_count=16, seed=1), workers=1)
    return dst


class Batches:
    """The batches of a :class:`BatchStream` (a worker failure raises), lazily, re-iterable."""

    def __init__(self, stream: BatchStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Any]:
        return raise_failures(self.stream)


def batches_on_cpu(ds: Path, device: str, transform: ImageTransform, **kw: Any
                   ) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """One epoch of ``ShardLoader(ds, batch_size=16, keys=True, seed=7, **kw)`` on ``device``, each
    batch's images and labels copied to the CPU."""
    loader = ShardLoader(str(ds), batch_size=16, transform=transform, device=device, keys=True, seed=7, **kw)
    return [(x.cpu(), y.cpu(), k) for x, y, k in loader]


def raw_and_cpu_streams(ds: Path, transform: ImageTransform, seed: int = 5, batch_size: int = 16,
                        gray: bool = False) -> tuple[Batches, Batches]:
    """Epoch-1 batches of one plan: the CPU path's and the GPU path's worker side (``gray``:
    grayscale JPEGs shipped encoded)."""
    loader = ShardLoader(str(ds), batch_size=batch_size, transform=transform, seed=seed)
    reader = ShardReader(loader.reader.store, loader.manifest.shards,
                         cache_dir=str(ds / "cache"))
    control = torch.tensor([1, 0])
    cpu = BatchStream(loader.config, CpuBatchBuilder(reader, transform), control)
    raw = BatchStream(loader.config, RawBatchBuilder(reader, transform, gray=gray), control)
    return Batches(cpu), Batches(raw)


def pixels(batch: CpuBatch | DeviceBatch) -> torch.Tensor:
    """A CPU-route batch's uint8 images tensor (or a GPU-route batch's delivered one)."""
    if not isinstance(batch.images, torch.Tensor):
        raise TypeError(type(batch.images))
    return batch.images


def raw_images(batch: RawBatch) -> RawImages:
    """A GPU-path worker batch's :class:`RawImages`."""
    if not isinstance(batch.images, RawImages):
        raise TypeError(type(batch.images))
    return batch.images


def emulate_device(batch: RawBatch, decode: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None
                   ) -> torch.Tensor:
    """What the GPU pipeline computes for a raw batch: ``decode`` (default: the CPU decoder) the
    JPEGs, then the eager resize on the CPU."""
    raw = batch.images
    if not isinstance(raw, RawImages):
        raise TypeError(type(raw))
    out = torch.zeros((len(raw), 3, *raw.size), dtype=torch.uint8)
    if raw.cpu_dest.numel():
        out[raw.cpu_dest] = raw.cpu_images
    if decode is None:
        images = [decode_rgb(bytes(j.numpy())).contiguous().reshape(-1) for j in raw.jpegs()]
    else:
        images = [im.cpu().contiguous().reshape(-1) for im in decode(raw.jpegs())]
    if images:
        crop_resize_flip_batch(torch.cat(images), chw_offsets(raw.geometry), raw.geometry, raw.size,
                               out=out, compile=False)
    return out


def staged(batch: StagedBatch) -> PinnedSlot:
    """A worker batch staged as the prefetcher stages it, in pageable memory (no CUDA)."""
    raw = batch.images
    slot = PinnedSlot(len(raw), raw.size, len(GEOMETRY_COLUMNS), pin=False)
    slot.stage(batch)
    return slot
