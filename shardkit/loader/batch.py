"""Build one batch in a worker: read samples, decode, transform into one buffer, apply the
bad-sample policy. A plain picklable object; no process or epoch logic here.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import get_worker_info

from shardkit.codec.decode import DecodeStats, decode_rgb, is_jpeg, peek_size
from shardkit.codec.jpeg_region import decode_box_rgb, roi_available, within_pixel_limit
from shardkit.errors import DecodeError, LoaderError
from shardkit.format.spec import IMAGE_MEMBER_EXTENSIONS
from shardkit.loader.bad_samples import BadSample, fill_batch
from shardkit.loader.reader import ShardReader
from shardkit.loader.ring import BatchRing, SlotImages
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.params import CropFlip

ON_ERROR = ("replace", "raise")


@dataclass
class Batch:
    """What a worker ships: images (uint8 ``[B,3,H,W]`` or a list), labels, keys, stats;
    detection batches (COCO) carry ``targets`` (one dict per image) and an empty ``labels``.

    In a worker, ``images`` may be a :class:`~shardkit.loader.ring.SlotImages`, which arrives in
    the main process as the tensor. Labels travel as a numpy array (pickled inline) rather than
    as a tensor, which torch would move into a new shared-memory segment for every batch.
    """

    images: torch.Tensor | list[torch.Tensor] | SlotImages
    labels: torch.Tensor
    keys: list[str]
    stats: StageStats
    targets: list[dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.labels.device.type == "cpu":
            state["labels"] = self.labels.numpy()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if not isinstance(state["labels"], torch.Tensor):
            state["labels"] = torch.from_numpy(state["labels"])
        self.__dict__.update(state)

    def pin_memory(self) -> Batch:
        """This batch with its tensors in page-locked memory (DataLoader's pin-memory thread
        calls this when the loader delivers to CUDA from CPU-decoded batches)."""
        images = self.images
        if isinstance(images, torch.Tensor):
            images = images.pin_memory()
        elif isinstance(images, list):
            images = [im.pin_memory() for im in images]
        return replace(self, images=images, labels=self.labels.pin_memory())


def _image_field(fields: dict[str, bytes], where: str) -> bytes:
    for ext, data in fields.items():
        if ext in IMAGE_MEMBER_EXTENSIONS:
            return data
    raise BadSample(f"{where}: no image member (has {sorted(fields)})")


def _label(fields: dict[str, bytes], where: str) -> int:
    try:
        return int(fields["cls"])
    except (KeyError, ValueError) as err:
        raise BadSample(f"{where}: missing or malformed cls member") from err


def _batch_buffer(shape: tuple[int, ...], ring: BatchRing | None) -> tuple[torch.Tensor, torch.Tensor | SlotImages]:
    """A uint8 batch tensor to fill, and what to ship. In a DataLoader worker: a free slot of
    ``ring`` when there is one, else a tensor allocated in shared memory from the start (torch
    would copy a non-shared one into shared memory to ship it)."""
    info = get_worker_info()
    if info is None:
        out = torch.empty(shape, dtype=torch.uint8)
        return out, out
    if ring is not None:
        got = ring.acquire(info.id, shape[0])
        if got is not None:
            return got
    out = torch.empty(shape, dtype=torch.uint8).share_memory_()
    return out, out


def decode_for(transform: ImageTransform, raw: bytes, rng: random.Random, where: str,
               dstats: DecodeStats) -> tuple[torch.Tensor, CropFlip]:
    """Decode what ``transform`` needs and draw its parameters (always the same draws from
    ``rng``, whichever decoder runs). Crop-first transforms on JPEGs decode only their box."""
    if transform.crop_first and roi_available() and is_jpeg(raw):
        height, width = peek_size(raw)
        params = transform.sample_params(height, width, rng)
        region = decode_box_rgb(raw, params) if within_pixel_limit(height, width) else None
        if region is not None:
            dstats.fast += 1
            return region, CropFlip(0, 0, params.height, params.width, params.flip)
        image = decode_rgb(raw, where=where, stats=dstats)
        if tuple(image.shape[-2:]) != (height, width):
            raise DecodeError(f"header says {height}x{width}, image decodes to {tuple(image.shape[-2:])}", where=where)
        return image, params
    image = decode_rgb(raw, where=where, stats=dstats)
    return image, transform.sample_params(image.shape[-2], image.shape[-1], rng)


class BatchBuilder:
    """Turn ``(shard, index, seed)`` triples into a :class:`Batch`.

    ``transform``: an :class:`ImageTransform` (fast path: writes straight into one uint8 batch
    tensor), any other callable ``uint8 [3,H,W] -> Tensor`` (run under a forked torch RNG seeded
    per sample, so the caller's global RNG is untouched; outputs stacked), or ``None`` (a list of
    decoded images). ``on_error="replace"`` replaces a corrupt sample deterministically and counts
    it (see :mod:`shardkit.loader.bad_samples`); ``"raise"`` raises :class:`LoaderError` naming
    shard and key. ``ring``: reusable shared batch buffers for the :class:`ImageTransform` path
    in worker processes (see :mod:`shardkit.loader.ring`).
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform | Callable[[torch.Tensor], Any] | None,
                 *, on_error: str = "replace", ring: BatchRing | None = None) -> None:
        if on_error not in ON_ERROR:
            raise LoaderError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.reader = reader
        self.transform = transform
        self.on_error = on_error
        self.ring = ring

    def _one(self, shard: int, index: int, seed: int, out: torch.Tensor | None,
             stats: StageStats, dstats: DecodeStats) -> tuple[int, Any]:
        t0 = time.perf_counter()
        key, fields = self.reader.read(shard, index)
        where = f"{self.reader.store.path(self.reader.shards[shard].url)}:{key}"
        t1 = time.perf_counter()
        stats.read_s += t1 - t0
        label = _label(fields, where)
        raw = _image_field(fields, where)
        transform = self.transform
        try:
            if isinstance(transform, ImageTransform):
                image, params = decode_for(transform, raw, random.Random(seed), where, dstats)
            else:
                image = decode_rgb(raw, where=where, stats=dstats)
        except DecodeError as err:
            raise BadSample(str(err)) from err
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        if isinstance(transform, ImageTransform):
            result: Any = transform.apply(image, params, out=out)
        elif transform is not None:
            with torch.random.fork_rng(devices=[]):  # the caller's global RNG stays as it was
                torch.manual_seed(seed)
                result = transform(image)
        else:
            result = image
        stats.transform_s += time.perf_counter() - t2
        return label, result

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> Batch:
        """Read, decode and transform the given samples, in order."""
        n = len(shards)
        stats, dstats = StageStats(batches=1, samples=n), DecodeStats()
        out: torch.Tensor | None = None
        shipped: torch.Tensor | SlotImages | None = None
        if isinstance(self.transform, ImageTransform):
            out, shipped = _batch_buffer((n, 3, *self.transform.output_size), self.ring)

        def attempt(slot: int, shard: int, index: int, seed: int) -> tuple[int, Any]:
            return self._one(shard, index, seed, out[slot] if out is not None else None, stats, dstats)

        try:
            got = fill_batch(attempt, self.reader, shards, indices, seeds, on_error=self.on_error)
        except BaseException:
            if isinstance(shipped, SlotImages):
                shipped.release()  # nothing will be shipped from this slot
            raise
        keys = got.keys
        labels = torch.tensor([label for label, _ in got.results], dtype=torch.int64)
        results = [result for _, result in got.results]
        if out is not None:
            for dst, src in got.copies:
                out[dst].copy_(out[src])
        stats.replaced += got.replaced
        stats.fast, stats.fallback = dstats.fast, dstats.fallback
        if out is not None and shipped is not None:
            return Batch(shipped, labels, keys, stats)
        if self.transform is not None and all(isinstance(r, torch.Tensor) for r in results):
            shapes = {tuple(r.shape) for r in results}
            if len(shapes) == 1:
                return Batch(torch.stack(results), labels, keys, stats)
        return Batch(results, labels, keys, stats)
