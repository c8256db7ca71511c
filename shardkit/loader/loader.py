"""``ShardLoader``: what a user iterates in place of ``DataLoader(ImageFolder(...))``."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardkit.errors import LoaderError
from shardkit.index.manifest import locate_dataset, read_manifest
from shardkit.loader.batch import Batch, BatchBuilder
from shardkit.loader.detection import detection_builder, to_device
from shardkit.loader.gpu_setup import GpuPath, gpu_path
from shardkit.loader.reader import ShardReader
from shardkit.loader.state import LoaderState, check_compatible, shards_digest
from shardkit.loader.stats import StageStats
from shardkit.loader.stream import BatchStream, PlanConfig
from shardkit.transforms.base import ImageTransform


def _init_worker(_worker_id: int) -> None:
    torch.set_num_threads(1)  # one core per worker; decode and resize are single-threaded anyway


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardLoader:
    """Stream a packed dataset as batches, with exact epochs over ranks and workers.

    Args:
        dataset: a packed dataset: directory, ``index.json`` path or fsspec URL.
        batch_size: samples per batch (per rank).
        transform: an :class:`~shardkit.transforms.ImageTransform` such as
            ``transforms.imagenet_train(224)`` (images come as one uint8 ``[B,3,H,W]`` tensor,
            finalised on ``device``), any callable on uint8 ``[3,H,W]`` tensors, or ``None``
            (a list of decoded images). COCO datasets: a detection transform
            (``transforms.detection_train(...)``/``detection_val(...)``) or ``None``; batches
            are ``(images, targets)``, see :mod:`shardkit.loader.detection`.
        num_workers: worker processes (persistent across epochs); 0 reads in this process.
        device: where batches are delivered (``"cpu"`` or ``"cuda[:i]"``).
        shuffle, seed: epoch order is a pure function of ``(seed, epoch, manifest)``.
        drop_last: True: every sample at most once per epoch; False: at least once, padded.
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        keys: also yield each batch's list of sample keys.
        window: shards mixed by the within-window shuffle (bounds memory and open files).
        on_error: ``"replace"`` corrupt samples (counted in :attr:`stats`) or ``"raise"``.
        prefetch: batches each worker prepares ahead.
        cache_dir: local cache for shards of a remote dataset.
        storage_options: fsspec options for a remote dataset.
        compile: GPU path only: run crop-resize-flip as one Triton kernel per batch (True) or
            as the eager torch reference (False); both give the same pixels.
        device_prefetch: GPU path only: batches decoded ahead on the prefetch stream.
        contiguous_labels: COCO only: labels 1..K in category-id order (0: background) instead
            of the category ids; the mapping is :attr:`label_map`.
        masks: COCO only: targets also hold ``masks`` uint8 ``[N,H,W]`` (needs pycocotools).
        pad: COCO only: images as one zero-padded :class:`~shardkit.loader.detection.PaddedImages`
            ``(images, sizes)`` instead of a list (an int: sides rounded up to its multiple).

    GPU path: with a CUDA ``device`` and an :class:`ImageTransform`, workers ship JPEG bytes and
    crop boxes (drawn as on the CPU path: same crops and flips per sample), and the main process
    decodes each batch with nvJPEG and crops, resizes and flips it in one launch, overlapping the
    training step (see :mod:`shardkit.loader.prefetch`). Images nvJPEG cannot take are decoded
    on the CPU and joined to the batch. Without CUDA or nvJPEG, one warning is logged and the
    CPU path is used (on the CPU when CUDA is missing altogether).

    Example::

        loader = ShardLoader("shards/train", batch_size=256, transform=transforms.imagenet_train(224),
                             num_workers=8)
        for epoch in range(90):
            for images, labels in loader:
                ...
        state = loader.state_dict()  # tiny, JSON-able; load_state_dict() resumes exactly
    """

    def __init__(
        self,
        dataset: str,
        *,
        batch_size: int,
        transform: ImageTransform | Callable[..., Any] | None = None,
        num_workers: int = 0,
        device: str | torch.device = "cpu",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        keys: bool = False,
        window: int = 8,
        on_error: str = "replace",
        prefetch: int = 2,
        cache_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        compile: bool = True,
        device_prefetch: int = 2,
        contiguous_labels: bool = False,
        masks: bool = False,
        pad: bool | int = False,
    ) -> None:
        if num_workers < 0:
            raise LoaderError(f"num_workers must be >= 0, got {num_workers}")
        store = locate_dataset(dataset, storage_options)
        self.manifest = read_manifest(store)
        if rank is None or world_size is None:
            detected_rank, detected_world = _distributed()
            rank = detected_rank if rank is None else rank
            world_size = detected_world if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise LoaderError(f"rank must be in [0, world_size) and world_size >= 1, got rank={rank}, world_size={world_size}")
        self.config = PlanConfig(
            shard_sizes=tuple(s.num_samples for s in self.manifest.shards), seed=seed, shuffle=shuffle,
            window=window, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
        )
        if self.config.num_samples == 0:
            raise LoaderError("dataset has no samples", where=store.url)
        self._num_batches = self.config.num_batches  # validates rank/world/batch size
        self.transform = transform
        self.device = torch.device(device)
        self._gpu: GpuPath | None = None
        if self.device.type == "cuda" and isinstance(transform, ImageTransform) and self.manifest.kind != "coco":
            self._gpu, self.device = gpu_path(transform, self.device, batch_size=batch_size, compile=compile,
                                              depth=device_prefetch, num_workers=num_workers, prefetch=prefetch)
        self.keys = keys
        self.num_workers = num_workers
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "shardkit-cache")
        reader = ShardReader(store, self.manifest.shards, cache_dir=cache)
        detection = detection_builder(self.manifest, reader, transform, on_error=on_error, masks=masks,
                                      pad=pad, contiguous_labels=contiguous_labels)
        #: COCO with ``contiguous_labels``: category id -> label; otherwise None (labels are the ids).
        self.label_map = detection.label_map if detection is not None else None
        self.categories = self.manifest.categories
        builder = (detection if detection is not None else self._gpu.builder(reader, on_error) if self._gpu is not None
                   else BatchBuilder(reader, transform, on_error=on_error))
        self._control = torch.zeros(2, dtype=torch.int64).share_memory_()
        self._stream = BatchStream(self.config, builder, self._control)
        self._dataloader: DataLoader[Batch] | None = None
        if num_workers > 0:
            self._dataloader = DataLoader(
                self._stream, batch_size=None, num_workers=num_workers, persistent_workers=True,
                prefetch_factor=prefetch, pin_memory=self.device.type == "cuda" and self._gpu is None,
                worker_init_fn=_init_worker,
            )
        # Where we stand: the next batch to deliver is batch _pos[1] of epoch _pos[0]. _fresh:
        # _pos was set as a starting point (init, set_epoch, load_state_dict, epoch finished);
        # otherwise an iteration was abandoned mid-epoch and the next one starts a new epoch.
        self._pos, self._fresh = (0, 0), True
        self._stats = StageStats()

    def __len__(self) -> int:
        """Batches this rank yields per epoch (the same on every rank)."""
        return self._num_batches

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the one the next iteration runs."""
        return self._pos[0]

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start."""
        if epoch < 0:
            raise LoaderError(f"epoch must be >= 0, got {epoch}")
        self._pos, self._fresh = (epoch, 0), True

    @property
    def stats(self) -> StageStats:
        """Counters and per-stage times accumulated since the loader was created."""
        return self._stats

    def __iter__(self) -> Iterator[Any]:
        if not self._fresh:
            self._pos = (self._pos[0] + 1, 0)
        epoch, start = self._pos
        self._fresh = False
        self._control[0], self._control[1] = epoch, start
        source: Any = iter(self._dataloader) if self._dataloader is not None else iter(self._stream)
        if self._gpu is not None:
            source = iter(self._gpu.prefetch(source, self._stats))
        last = time.perf_counter()
        for consumed in range(start + 1, self._num_batches + 1):
            t0 = time.perf_counter()
            try:
                batch = next(source)
            except StopIteration:
                raise LoaderError(f"workers ended epoch {epoch} after {consumed - 1} of {self._num_batches} batches") from None
            t1 = time.perf_counter()
            if self._gpu is not None:  # already finalised on the device by the prefetcher
                images, labels = batch.images, batch.labels
            else:
                images = self._deliver(batch.images)
                labels = (batch.labels.to(self.device, non_blocking=True) if batch.targets is None
                          else to_device(batch.targets, self.device))
            t2 = time.perf_counter()
            self._stats.add(batch.stats)
            self._stats.wait_s += t1 - t0
            self._stats.copy_s += t2 - t1
            self._stats.elapsed_s += t2 - last  # includes the consumer's time: throughput as training sees it
            last = t2
            self._pos = (epoch, consumed)
            yield (images, labels, batch.keys) if self.keys else (images, labels)
        self._pos, self._fresh = (epoch + 1, 0), True

    def _deliver(self, images: torch.Tensor | list[torch.Tensor]) -> Any:
        if not isinstance(images, torch.Tensor):  # a list, or detection's PaddedImages
            return to_device(images, self.device)
        images = images.to(self.device, non_blocking=True)
        if isinstance(self.transform, ImageTransform):
            images = self.transform.finalize(images)
        return images

    def _state(self, epoch: int, consumed: int) -> LoaderState:
        cfg = self.config
        return LoaderState(
            seed=cfg.seed, epoch=epoch, batches_consumed=consumed, num_samples=cfg.num_samples,
            shards_digest=shards_digest(cfg.shard_sizes), world_size=cfg.world_size,
            batch_size=cfg.batch_size, drop_last=cfg.drop_last, shuffle=cfg.shuffle, window=cfg.window,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as a tiny JSON-able dict (the same on every rank).

        Loading it into a fresh loader (any ``num_workers``) continues with exactly the batches
        not yet delivered, with the same samples, order and augmentation.
        """
        return self._state(*self._pos).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output; refuses a state made for another configuration."""
        s = LoaderState.from_dict(state)
        cfg = self.config
        check_compatible(
            s, seed=cfg.seed, num_samples=cfg.num_samples, shards_digest=shards_digest(cfg.shard_sizes),
            world_size=cfg.world_size, batch_size=cfg.batch_size, drop_last=cfg.drop_last,
            shuffle=cfg.shuffle, window=cfg.window,
        )
        done = s.batches_consumed >= self._num_batches
        self._pos, self._fresh = ((s.epoch + 1, 0) if done else (s.epoch, s.batches_consumed)), True
