"""The CPU route's worker half: read samples, decode, transform into one batch tensor.

A plain picklable object; no process or epoch logic here.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardkit._compat import collate_joining_tensors_with
from shardkit.codec.decode import DecodeStats, decode_rgb
from shardkit.errors import DecodeError, LoaderError
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.read.samples import Sample, SampleSource, decode_for
from shardkit.loader.read.user_errors import blame
from shardkit.loader.routes.base import map_tensors
from shardkit.loader.routes.cpu.shared_pool import FdImages, SharedBatchPool, SlotImages
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.rng import seeded

__all__ = ["CpuBatch", "CpuBatchBuilder"]


#: Steps of a transform pipeline written for PIL images: torchvision's ``ToTensor`` and
#: ``PILToTensor``, timm's ``MaybeToTensor`` and ``MaybePILToTensor`` (which pass a tensor through
#: as it is, so a uint8 tensor reaches a ``Normalize`` that wants floats).
PIL_STEPS = frozenset({"ToTensor", "PILToTensor", "MaybeToTensor", "MaybePILToTensor"})
#: Steps that turn the loader's tensor into what a PIL step takes.
TO_PIL_STEPS = frozenset({"ToPILImage"})


def pil_step(transform: Any, *, tensor_refused: bool = False) -> str | None:
    """The name of the first step of ``transform`` (a ``Compose``, nested ones too) written for
    PIL images (:data:`PIL_STEPS`) that the loader's tensor reaches as a tensor (no
    ``ToPILImage`` before it): ``""`` for ``transform`` itself taking PIL images (its TypeError
    says so: ``tensor_refused``) with no ``ToPILImage`` in it; otherwise None, and None where the
    pipeline cannot be walked.

    Example:
        >>> from torchvision import transforms as T
        >>> pil_step(T.Compose([T.Resize(8), T.Compose([T.ToTensor()])])), pil_step(T.Resize(8))
        ('ToTensor', None)
        >>> pil_step(T.Compose([T.ToPILImage(), T.ToTensor()])) is None
        True
        >>> pil_step(T.Resize(8), tensor_refused=True)
        ''
    """
    try:
        for name in _step_names(transform, set()):
            if name in TO_PIL_STEPS:
                return None
            if name in PIL_STEPS:
                return name
    except Exception:  # a pipeline of its own making: its error is told as it is
        return None
    return "" if tensor_refused else None


def _step_names(transform: Any, seen: set[int]) -> Iterator[str]:
    """The class names of ``transform`` and of its steps (``.transforms``, nested), in order."""
    if id(transform) in seen:
        return
    seen.add(id(transform))
    yield type(transform).__name__
    inner = getattr(transform, "transforms", None)
    if isinstance(inner, (list, tuple)):
        for step in inner:
            yield from _step_names(step, seen)


@dataclass
class CpuBatch:
    """A classification batch: ``images`` uint8 ``[B,3,H,W]`` (an :class:`ImageTransform` or a
    callable with same-size outputs), a callable's dicts, tuples or lists joined as
    ``default_collate`` joins them, or a list of tensors (no transform, or mixed sizes),
    ``labels`` int64 ``[B]`` (captioned images: the batch's text, see
    :class:`~shardkit.loader.read.captions.CaptionTargets`), sample ``keys`` and the worker's ``stats``.

    In a worker, ``images`` may live in a slot of the :class:`SharedBatchPool`: then only the
    slot reference is pickled (``slot``) and the main process gets a tensor over the slot's
    memory. Labels travel as a numpy array (pickled inline) rather than as a tensor, which torch
    would move into a new shared-memory segment for every batch.
    """

    images: torch.Tensor | list[torch.Tensor] | Any
    labels: torch.Tensor | Any
    keys: list[str]
    stats: StageStats
    slot: SlotImages | FdImages | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.slot is not None:
            state["images"], state["slot"] = self.slot, None  # unpickles as the tensor
        if isinstance(self.labels, torch.Tensor) and self.labels.device.type == "cpu":
            state["labels"], state["_numpy_labels"] = self.labels.numpy(), True
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.pop("_numpy_labels", False):
            state["labels"] = torch.from_numpy(state["labels"])
        self.__dict__.update(state)

    def pin_memory(self) -> CpuBatch:
        """This batch with its tensors in page-locked memory (DataLoader's pin-memory thread
        calls this when the loader delivers CPU-decoded batches to CUDA)."""
        # the tensors inside too: a caption batch's text, a transform's collated dicts or pairs
        return replace(self, images=map_tensors(self.images, torch.Tensor.pin_memory),
                       labels=map_tensors(self.labels, torch.Tensor.pin_memory))


def _batch_buffer(shape: tuple[int, ...],
                  pool: SharedBatchPool | None) -> tuple[torch.Tensor, SlotImages | FdImages | None]:
    """A uint8 batch tensor to fill and, in a DataLoader worker, how it is shipped: its slot of
    ``pool``, or without a free slot a shared-memory segment of its own (torch would copy a
    non-shared tensor into shared memory to ship it; neither leaves a name in /dev/shm)."""
    info = get_worker_info()
    if info is None:
        return torch.empty(shape, dtype=torch.uint8), None
    if pool is not None:
        got = pool.acquire(info.id, shape[0])
        if got is not None:
            return got
    own = FdImages(shape)
    return own.images, own


def _layout(value: Any) -> Any:
    """What must be equal across a batch's outputs for ``default_collate`` to join them without
    loss or silent conversion: the container types, keys and lengths all the way down, each
    tensor's and array's dtype and shape, each leaf's type. None: something it does not join."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape))
    if isinstance(value, np.ndarray):
        return None if value.dtype.hasobject else ("array", value.dtype.str, value.shape)
    if isinstance(value, np.generic):  # a numpy scalar: np.float32(0.5), np.int64(3)
        return None if value.dtype.hasobject else ("scalar", value.dtype.str)
    if isinstance(value, Mapping):
        parts = [(repr(k), _layout(v)) for k, v in value.items()]
        return None if any(p is None for _, p in parts) else (type(value), tuple(sorted(parts, key=lambda p: p[0])))
    if isinstance(value, (tuple, list)):
        parts = [_layout(v) for v in value]
        return None if any(p is None for p in parts) else (type(value), tuple(parts))
    if isinstance(value, (bool, int, float, str, bytes)):
        return type(value)
    return None


_SENDABLE: set[tuple[int, type]] = set()  # (process, type of a transform's output) found to pickle


def _check_sendable(result: object, where: str) -> None:
    """In a worker process, once per type of output: ``result`` (what a transform returned) must
    pickle to reach the training process. Where it does not, torch's queue thread only prints the
    error and the training loop waits for the batch forever; a LoaderError names the sample instead.

    Raises:
        LoaderError: ``result`` cannot be pickled.
    """
    seen = (os.getpid(), type(result))
    if seen in _SENDABLE or get_worker_info() is None:
        return
    try:
        pickle.dumps(result)
    except Exception as err:  # pickling raises many types: AttributeError, TypeError, PicklingError
        raise LoaderError(f"the transform returned a {type(result).__name__}, which cannot be sent from a worker "
                          f"process ({type(err).__name__}: {err}); return tensors, numbers or other picklable "
                          "objects, or use num_workers=0", where=where) from None
    _SENDABLE.add(seen)


class CpuBatchBuilder:
    """Turn ``(shard, index, seed)`` triples into a :class:`CpuBatch`.

    ``transform``: an :class:`ImageTransform` (fast path: writes straight into one uint8 batch
    tensor), any other callable ``uint8 [3,H,W] -> Tensor`` (run under a forked torch RNG seeded
    per sample, so the caller's global RNG is untouched; outputs stacked, or joined as
    ``default_collate`` joins them), or ``None`` (a list of
    decoded images). ``on_error="replace"`` replaces a corrupt sample deterministically and counts
    it (see :mod:`shardkit.loader.read.bad_samples`); ``"raise"`` raises :class:`LoaderError` naming
    shard and key; a label at or above ``num_classes`` is a bad sample. ``pool``: reusable shared
    batch buffers for the :class:`ImageTransform` path in worker processes
    (see :mod:`shardkit.loader.routes.cpu.shared_pool`). ``captions``: the samples are captioned
    images; each batch's ``labels`` is then its text (:class:`CaptionTargets`), not class labels.
    """

    def __init__(self, reader: ShardReader, transform: ImageTransform | Callable[[torch.Tensor], Any] | None,
                 *, on_error: str = "replace", pool: SharedBatchPool | None = None,
                 num_classes: int | None = None, captions: CaptionTargets | None = None) -> None:
        self.samples = SampleSource(reader, on_error, num_classes)
        self.transform = transform
        self.pool = pool
        self.captions = captions

    def _one(self, sample: Sample, seed: int, out: torch.Tensor | None, stats: StageStats,
             dstats: DecodeStats) -> tuple[Any, Any]:
        t1 = time.perf_counter()
        label: Any = (sample.label(self.samples.num_classes) if self.captions is None
                      else self.captions.read(sample))
        raw, transform = sample.image(), self.transform
        if isinstance(transform, ImageTransform):
            image, params = decode_for(transform, raw, seed, sample.where, dstats)
        else:
            try:
                image = decode_rgb(raw, where=sample.where, stats=dstats)
            except DecodeError as err:
                raise BadSample(str(err)) from err
        t2 = time.perf_counter()
        stats.decode_s += t2 - t1
        if isinstance(transform, ImageTransform):
            result: Any = transform.apply(image, params, out=out)
        elif transform is not None:
            with seeded(seed):  # torch's, random's and numpy's; the caller's RNG states stay as they were
                try:
                    result = transform(image)
                except Exception as err:
                    step = pil_step(transform, tensor_refused=isinstance(err, TypeError) and "PIL" in str(err))
                    if step is None:
                        blame(err, sample.where)
                        raise
                    raise LoaderError(f"the transform takes PIL images{f' (it has {step})' if step else ''}, and "
                                      "shardkit gives it each image as a uint8 [3, H, W] tensor: put "
                                      "torchvision.transforms.v2.ToPILImage() first (timm's create_transform "
                                      "too), or use torchvision.transforms.v2, which takes tensors "
                                      f"(v2.ToDtype(torch.float32, scale=True) for ToTensor) ({err})",
                                      where=sample.where) from None
            if result is None:
                raise LoaderError(f"the transform returned None (a function without a return?): {transform!r:.60}",
                                  where=sample.where)
        else:
            result = image
        stats.transform_s += time.perf_counter() - t2
        return label, result

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> CpuBatch:
        """Read, decode and transform the given samples, in order."""
        out: torch.Tensor | None = None
        slot: SlotImages | FdImages | None = None
        if isinstance(self.transform, ImageTransform):
            out, slot = _batch_buffer((len(shards), 3, *self.transform.output_size), self.pool)
        try:
            got, stats = self.samples.fill(
                lambda i, sample, seed, stats, dstats: self._one(sample, seed, out[i] if out is not None else None,
                                                                 stats, dstats),
                shards, indices, seeds)
        except BaseException:
            if slot is not None:
                slot.release()  # nothing will be shipped from this slot
            raise
        targets = [label for label, _ in got.results]
        try:
            if self.captions is None:
                labels = torch.tensor(targets, dtype=torch.int64)
            else:
                labels = self.captions.collate(
                    targets, f"{self.samples.reader.where(int(shards[got.source(0)]))}:{got.keys[0]}")
        except BaseException:
            if slot is not None:
                slot.release()  # nor from this one: the text_transform failed
            raise
        results = [result for _, result in got.results]
        if out is not None:
            for dst, src in got.copies:
                out[dst].copy_(out[src])
            return CpuBatch(out, labels, got.keys, stats, slot)
        same_size = len({tuple(r.shape) if isinstance(r, torch.Tensor) else None for r in results}) == 1
        if self.transform is not None and same_size and isinstance(results[0], torch.Tensor):
            return CpuBatch(_stacked(results), labels, got.keys, stats)
        if self.transform is not None and results and not isinstance(results[0], torch.Tensor):
            _check_sendable(results[0], f"{self.samples.reader.where(int(shards[got.source(0)]))}:{got.keys[0]}")
            batch = _collated(results)
            if batch is not None:
                return CpuBatch(batch, labels, got.keys, stats)
        return CpuBatch(results, labels, got.keys, stats)


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``; in a worker process contiguous, as ``default_collate`` stacks
    there, but in private memory (it stacks into a new segment of /dev/shm): the thread that
    sends the batch copies it into a nameless segment (:class:`~shardkit.loader.run.stream.Shipped`)
    while this one goes on to the next batch, and the memory here is reused by the next stack."""
    if get_worker_info() is None:
        return torch.stack(tensors)
    first = tensors[0]
    out = torch.empty((len(tensors), *first.shape), dtype=first.dtype, device=first.device)
    return torch.stack(tensors, out=out)


def _collated(results: list[Any]) -> Any:
    """A transform's outputs joined as a DataLoader's ``default_collate`` joins them: numpy arrays
    of one shape and dtype as one stacked tensor; numbers (Python's or numpy's, of one type) as
    one tensor; dicts, tuples and lists (two views of an image, an image and its mask) as one of
    the same kind, each field stacked. None where they do not join (sizes, dtypes or keys that
    differ; other types): the batch is then the list of them."""
    first = results[0]
    if isinstance(first, (Mapping, tuple, list, bool, int, float, np.generic)):
        layout = _layout(first)
        if layout is None or any(_layout(r) != layout for r in results[1:]):
            return None
        try:
            return collate_joining_tensors_with(results, _stacked)
        except (RuntimeError, TypeError, ValueError, KeyError, IndexError):
            return None
    if not isinstance(first, np.ndarray) or first.dtype.hasobject:
        return None
    if any(not isinstance(r, np.ndarray) or r.shape != first.shape or r.dtype != first.dtype for r in results):
        return None
    return torch.from_numpy(np.stack(results))
