"""Worker side of the GPU path: ship raw JPEG bytes plus crop geometry instead of pixels.

For each sample the worker reads the image size from the header, draws the crop/flip from the
same seeded ``random.Random(seed)`` as the CPU path (so both paths crop and flip every sample
alike) and ships the encoded bytes with one row of geometry
(:data:`~shardkit.transforms.gpu.GEOMETRY_COLUMNS`). Images nvJPEG cannot take
(:func:`~shardkit.loader.gpu_decode.nvjpeg_friendly`) are decoded and transformed here, exactly
as the CPU path does, and travel as pixels to be joined into the same batch on the device.

Shared-memory reuse: in a worker process the JPEG bytes of batch ``k`` go into buffer
``k % ring`` of a small per-worker ring of shared-memory tensors, so the main process (which keeps
them mapped) copies from already-mapped pages instead of faulting in a fresh segment per batch.
Safe for ``ring >= prefetch + 1`` (we use ``prefetch + 2``): torch's DataLoader sends a worker
the task for its batch ``j`` only when the main process takes that worker's batch
``j - prefetch``; the prefetcher stages (copies out of shared memory) batches in order before
taking the next, so by then batch ``j - prefetch - 1`` and all earlier ones have been copied,
and buffer ``j % ring`` last held batch ``j - ring``, one of those.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.batch import Batch, BatchBuilder, _BadSample, _image_field, _label
from shardkit.loader.decode import DecodeStats, decode_rgb, peek_size
from shardkit.loader.gpu_decode import nvjpeg_friendly
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS, gpu_window

__all__ = ["RawBatchBuilder", "RawImages"]


@dataclass
class RawImages:
    """A batch's images before the device: JPEG bytes for nvJPEG and pixels decoded on the CPU.

    ``data[bounds[i]:bounds[i+1]]`` is the i-th GPU image's JPEG, ``geometry[i]`` its crop row
    (its ``dest`` column is its position in the batch); ``cpu_images[k]`` (uint8
    ``[3, *size]``) goes to position ``cpu_dest[k]``.
    """

    data: torch.Tensor
    bounds: torch.Tensor
    geometry: torch.Tensor
    cpu_images: torch.Tensor
    cpu_dest: torch.Tensor
    size: tuple[int, int]

    def __len__(self) -> int:
        return int(self.geometry.shape[0] + self.cpu_dest.shape[0])

    def jpegs(self) -> list[torch.Tensor]:
        """Views of ``data``, one 1-D uint8 tensor per GPU image."""
        b = self.bounds.tolist()
        return [self.data[b[i]:b[i + 1]] for i in range(len(b) - 1)]


class _ShmRing:
    """Per-process shared-memory byte buffers, reused round-robin (see module doc)."""

    def __init__(self, slots: int) -> None:
        self.pid, self.bufs, self.next = os.getpid(), [torch.empty(0, dtype=torch.uint8)] * slots, 0

    def take(self, nbytes: int) -> torch.Tensor:
        k = self.next % len(self.bufs)
        self.next += 1
        if self.bufs[k].numel() < nbytes:
            self.bufs[k] = torch.empty(max(nbytes * 5 // 4, 1 << 20), dtype=torch.uint8).share_memory_()
        return self.bufs[k][:nbytes]


class RawBatchBuilder(BatchBuilder):
    """A :class:`BatchBuilder` whose batches carry :class:`RawImages` (needs an ImageTransform).

    ``shm_ring``: shared-memory buffers per worker process for JPEG bytes (0: a fresh tensor per
    batch); must be at least the DataLoader's ``prefetch_factor + 2``.
    """

    def __init__(self, reader: object, transform: ImageTransform, *, on_error: str = "replace",
                 shm_ring: int = 0) -> None:
        if not isinstance(transform, ImageTransform):
            raise LoaderError("the GPU path needs an ImageTransform (e.g. transforms.imagenet_train(224))")
        super().__init__(reader, transform, on_error=on_error)  # type: ignore[arg-type]
        self.shm_ring = shm_ring
        self._ring: _ShmRing | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_ring": None}  # each process makes its own ring

    def _buffer(self, nbytes: int) -> torch.Tensor:
        if self.shm_ring <= 0 or get_worker_info() is None:
            return torch.empty(nbytes, dtype=torch.uint8)
        if self._ring is None or self._ring.pid != os.getpid():
            self._ring = _ShmRing(self.shm_ring)
        return self._ring.take(nbytes)

    def _raw(self, shard: int, index: int, seed: int, stats: StageStats, dstats: DecodeStats
             ) -> tuple[str, int, bytes | torch.Tensor, tuple[int, ...] | None]:
        t0 = time.perf_counter()
        key, fields = self.reader.read(shard, index)
        where = f"{self.reader.store.path(self.reader.shards[shard].url)}:{key}"
        t1 = time.perf_counter()
        stats.read_s += t1 - t0
        label, data = _label(fields, where), _image_field(fields, where)
        transform: ImageTransform = self.transform  # type: ignore[assignment]
        rng = random.Random(seed)
        try:
            if nvjpeg_friendly(data):
                h, w = peek_size(data)
                params = transform.sample_params(h, w, rng)
                stats.transform_s += time.perf_counter() - t1
                return key, label, data, gpu_window(transform, h, w, params, transform.output_size)
            image = decode_rgb(data, where=where, stats=dstats)
        except DecodeError as err:
            raise _BadSample(str(err)) from err
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        params = transform.sample_params(image.shape[-2], image.shape[-1], rng)
        pixels = transform.apply(image, params)
        stats.transform_s += time.perf_counter() - t2
        return key, label, pixels, None

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> Batch:
        """Read the given samples in order; JPEGs stay encoded, the rest are decoded here."""
        n = len(shards)
        stats, dstats = StageStats(batches=1, samples=n), DecodeStats()
        keys, labels = [""] * n, torch.empty(n, dtype=torch.int64)
        items: list[tuple[bytes | torch.Tensor, tuple[int, ...] | None] | None] = [None] * n
        for i in range(n):
            try:
                keys[i], label, payload, window = self._raw(int(shards[i]), int(indices[i]), int(seeds[i]), stats, dstats)
                labels[i], items[i] = label, (payload, window)
            except _BadSample as err:
                if self.on_error == "raise":
                    raise LoaderError(f"bad sample ({err}); use on_error='replace' to skip such samples") from None
        bad = [i for i in range(n) if items[i] is None]
        if bad:
            self._replace(bad, n, None, keys, labels, items)  # type: ignore[arg-type]
            stats.replaced += len(bad)
        stats.fast, stats.fallback = dstats.fast, dstats.fallback
        stats.gpu_fallback = dstats.fast + dstats.fallback
        return Batch(self._pack(items), labels, keys, stats)  # type: ignore[arg-type]

    def _pack(self, items: list[tuple[bytes | torch.Tensor, tuple[int, ...] | None]]) -> RawImages:
        size = self.transform.output_size  # type: ignore[union-attr]
        jpegs = [(i, data, win) for i, (data, win) in enumerate(items) if win is not None]
        lengths = [len(d) for _, d, _ in jpegs]  # type: ignore[arg-type]
        return _pack(items, jpegs, lengths, self._buffer(sum(lengths)), size)


def _pack(items: list[tuple[bytes | torch.Tensor, tuple[int, ...] | None]], jpegs: list[tuple[int, object, object]],
          lengths: list[int], data: torch.Tensor, size: tuple[int, int]) -> RawImages:
    cpu = [(i, px) for i, (px, win) in enumerate(items) if win is None]
    view, pos = data.numpy(), 0
    for (_, d, _), length in zip(jpegs, lengths, strict=True):
        view[pos:pos + length] = np.frombuffer(d, dtype=np.uint8)  # type: ignore[arg-type]
        pos += length
    bounds = torch.zeros(len(jpegs) + 1, dtype=torch.int64)
    if lengths:
        bounds[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    rows = [(*win, i) for i, _, win in jpegs]  # type: ignore[misc]
    geometry = torch.tensor(rows, dtype=torch.int32).reshape(-1, len(GEOMETRY_COLUMNS))
    cpu_images = torch.stack([px for _, px in cpu]).contiguous() if cpu else torch.empty((0, 3, *size), dtype=torch.uint8)  # type: ignore[misc]
    cpu_dest = torch.tensor([i for i, _ in cpu], dtype=torch.int64)
    return RawImages(data, bounds, geometry, cpu_images, cpu_dest, size)
