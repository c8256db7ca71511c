"""NVIDIA DALI as a contender of ``shardkit bench --train``, written as NVIDIA's ResNet-50 example
writes its training pipeline.

``fn.decoders.image_random_crop`` (``device="mixed"``: nvJPEG and the hardware JPEG engines,
torchvision's crop area 0.08–1 and aspect 3/4–4/3), ``fn.resize`` to ``size x size`` (triangular:
antialiased bilinear, like torchvision's resize of a tensor), ``fn.crop_mirror_normalize`` (random
flip, ImageNet mean/std). It delivers what ShardLoader's GPU route delivers with
``imagenet_train(size, normalize=True, dtype=torch.bfloat16, channels_last=True)``: bf16
``[B, 3, size, size]`` in ``channels_last`` memory on the device, int64 labels. DALI has no bf16:
it writes float16 ``HWC`` and the batch is cast to bf16 on the device (one small kernel, counted
in the fed rate). Two readers:

* ``webdataset``: ``fn.readers.webdataset`` over the packed shards, with the ``.dali.idx`` files
  ``--dali-index`` writes when every shard has one; else the loader writes them into a temporary
  directory first (from the tar headers, as ``shardkit index --dali-index`` would), because DALI
  without them scans the tars at start-up and prints a C++ log line that cannot be turned off;
* ``file``: ``fn.readers.file`` over the ImageFolder tree (the reader of DALI's ResNet-50 example).

Each ``iter()`` is one shuffled epoch (the last partial batch dropped). DALI is imported when a
loader is built, never at module import; on ``device="cpu"`` the pipeline runs CPU-only
(``device_id=None``), which is how the tests exercise it.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

from shardkit.bench.baselines import IMAGE_KEYS
from shardkit.format.dali_index import dali_index_name, dump_dali_index
from shardkit.format.tarread import iter_entries
from shardkit.index.manifest_io import read_manifest
from shardkit.storage import Store

__all__ = ["DaliTrainLoader", "ascii_labels", "dali_available", "has_dali_index"]

READERS = ("webdataset", "file")
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def dali_available() -> bool:
    """Whether NVIDIA DALI is installed (``nvidia.dali`` can be found; not imported)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no ``nvidia`` namespace at all
        return False


def ascii_labels(padded: torch.Tensor) -> torch.Tensor:
    """Labels from ``cls`` members as DALI's webdataset reader gives them: ASCII digits, one row per
    sample, padded with zeros to the longest in the batch.

    Raises:
        ValueError: a row holds a byte that is neither a digit nor padding, or no digit.

    Example:
        >>> ascii_labels(torch.tensor([[55, 0], [49, 50]], dtype=torch.uint8)).tolist()
        [7, 12]
    """
    digits = padded.to(torch.int64) - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    if bool(((padded != 0) & ~is_digit).any()) or not bool(is_digit.any(dim=1).all()):
        raise ValueError(f"cls members are not ASCII digits: {padded.tolist()}")
    value = torch.zeros(padded.shape[0], dtype=torch.int64)
    for column in range(padded.shape[1]):  # Horner's rule, left to right; padding only at the end
        value = torch.where(is_digit[:, column], value * 10 + digits[:, column], value)
    return value


def _webdataset_inputs(shards: str) -> tuple[list[str], list[str]]:
    """Local paths of the dataset's shards, and of their DALI index files if every shard has one.

    Raises:
        ValueError: ``shards`` is not a local directory (DALI's reader takes local paths).
        ManifestError: it holds no valid ``index.json``.
    """
    if not os.path.isdir(shards):
        raise ValueError(f"DALI reads local shards: {shards!r} is not a local directory")
    store = Store(shards)
    names = [s.url for s in read_manifest(store).shards]
    tars = [os.path.join(shards, name) for name in names]
    indexes = [os.path.join(shards, dali_index_name(name)) for name in names]
    return tars, indexes if all(os.path.exists(p) for p in indexes) else []


def _write_indexes(tars: list[str], folder: str) -> list[str]:
    """DALI index files of the shards ``tars`` (from their tar headers), written into ``folder``."""
    paths = []
    for k, tar in enumerate(tars):
        with open(tar, "rb") as f:
            entries = list(iter_entries(f, where=tar, read_data=False, seekable=True))
        path = os.path.join(folder, f"{k:06d}-{dali_index_name(os.path.basename(tar))}")
        with open(path, "wb") as out:
            out.write(dump_dali_index(entries, where=tar))
        paths.append(path)
    return paths


def has_dali_index(shards: str) -> bool:
    """Whether every shard of the local dataset ``shards`` has its ``.dali.idx`` beside it."""
    return bool(_webdataset_inputs(shards)[1])


class DaliTrainLoader:
    """A DALI training pipeline behind the ``for images, labels in loader`` protocol.

    Args:
        reader: ``"webdataset"`` (``source`` is a packed dataset directory) or ``"file"``
            (``source`` is an ImageFolder tree).
        source: local directory, as above.
        size: output side in pixels.
        batch_size: images per batch; the last partial batch of an epoch is dropped.
        threads: DALI CPU threads (``num_threads``; at least 1).
        device: ``"cuda"``/``"cuda:N"`` (mixed decode, GPU resize) or ``"cpu"`` (CPU-only pipeline).
        seed: the pipeline's seed (crops, flips, shuffle).
        prefetch: DALI's ``prefetch_queue_depth``: batches it prepares ahead.
        hw_decoder_load: the share of JPEGs DALI sends to the hardware JPEG decoder (A100, H100,
            H200) rather than CUDA nvJPEG; None leaves DALI's default.

    Raises:
        ValueError: an unknown reader, or a device that is neither CPU nor CUDA.
        ImportError: DALI is not installed.

    Example::

        loader = DaliTrainLoader("webdataset", "shards/", size=176, batch_size=128, threads=8)
        for images, labels in loader:   # bf16 [128, 3, 176, 176] channels_last on cuda:0, int64
            ...
        loader.close()
    """

    def __init__(self, reader: str, source: str, *, size: int, batch_size: int, threads: int,
                 device: str = "cuda", seed: int = 0, prefetch: int = 2, hw_decoder_load: float | None = None) -> None:
        if reader not in READERS:
            raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
        dev = torch.device(device)
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        self.device = dev
        self.indexed = False  # whether the dataset has its own .dali.idx files
        self._made_indexes: tempfile.TemporaryDirectory[str] | None = None
        self._pipe = self._build(reader, source, size, batch_size, max(1, threads), seed, prefetch, hw_decoder_load)
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self._batches: Any = DALIGenericIterator(self._pipe, ["images", "labels"], reader_name="reader",
                                                 last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def _build(self, reader: str, source: str, size: int, batch_size: int, threads: int, seed: int, prefetch: int,
               hw_decoder_load: float | None) -> Any:
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device.type == "cuda"
        device_id = (self.device.index or 0) if gpu else None
        tars, indexes = _webdataset_inputs(source) if reader == "webdataset" else ([], [])
        self.indexed = bool(indexes)
        if tars and not indexes:
            self._made_indexes = tempfile.TemporaryDirectory(prefix="shardkit-dali-idx-")
            indexes = _write_indexes(tars, self._made_indexes.name)

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed,
                      prefetch_queue_depth=prefetch)
        def pipeline() -> Any:
            if reader == "webdataset":
                jpegs, labels = fn.readers.webdataset(
                    paths=tars, index_paths=indexes, ext=[IMAGE_KEYS, "cls"], missing_component_behavior="error",
                    random_shuffle=True, name="reader")
                labels = fn.pad(labels, fill_value=0)  # ASCII digits, ragged: parsed by ascii_labels
            else:
                jpegs, labels = fn.readers.file(file_root=source, random_shuffle=True, name="reader")
            # NVIDIA's ResNet-50 example: preallocated decoder memory so the first batches do not resize it
            padding: dict[str, float] = ({"device_memory_padding": 211025920, "host_memory_padding": 140544512}
                                         if gpu else {})
            if gpu and hw_decoder_load is not None:
                padding["hw_decoder_load"] = hw_decoder_load
            images = fn.decoders.image_random_crop(
                jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10, **padding)
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_TRIANGULAR)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="HWC", mean=list(MEAN),
                                              std=list(STD), mirror=fn.random.coin_flip(probability=0.5))
            return images, labels

        pipe = pipeline()
        pipe.build()
        return pipe

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for out in self._batches:  # auto_reset: the next iter() starts the next epoch
            hwc, labels = out[0]["images"], out[0]["labels"]
            # [B,H,W,C] viewed as [B,C,H,W] is channels_last; .to keeps that memory format
            images = hwc.permute(0, 3, 1, 2).to(torch.bfloat16)
            labels = ascii_labels(labels) if labels.dtype == torch.uint8 else labels.reshape(-1).to(torch.int64)
            yield images, labels

    def close(self) -> None:
        """Release the pipeline (its threads and device memory)."""
        self._batches = None
        self._pipe = None
        if self._made_indexes is not None:
            self._made_indexes.cleanup()
            self._made_indexes = None
