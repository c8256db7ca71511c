"""What ``shardkit bench`` compares and how (:class:`BenchConfig`), the loaders it can time, and
where it reports progress (:class:`ProgressSink`)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CAPTION_CONTENDERS", "COCO_CONTENDERS", "CONTENDERS", "BenchConfig", "ProgressSink"]

CONTENDERS = ("imagefolder", "webdataset", "shardloader")
#: On a captioned source (``BenchConfig.captions``): plain webdataset (``decode("pil").to_tuple("jpg",
#: "txt")``, the same crop and tokenizer) against ShardLoader with ``text_transform``.
CAPTION_CONTENDERS = ("webdataset", "shardloader")
#: On a COCO source (``BenchConfig.annotations``): torchvision CocoDetection against ShardLoader's
#: COCO route, and its COCO GPU route with ``device="cuda"``.
COCO_CONTENDERS = ("cocodetection", "shardloader", "shardloader-gpu")


class ProgressSink(Protocol):
    """Where :func:`run_bench` reports progress (the CLI draws a tqdm bar from it)."""

    def begin(self, what: str, total: int | None) -> None: ...
    def advance(self, n: int) -> None: ...
    def describe(self, text: str) -> None: ...


@dataclass(frozen=True)
class BenchConfig:
    """What to compare and how.

    ``shards``: a packed dataset of ``imagefolder``; None packs one into a temporary directory
    (removed afterwards); a path without ``index.json`` is packed into. ``transform``: ``train``
    (RandomResizedCrop + flip) or ``val`` (resize + centre crop), at ``size`` px, uint8 out.
    Each run iterates ``epochs`` epochs (None: 2, or more on a small data set,
    :func:`~shardkit.bench.checks.epochs_for`; the report gives the count run); its first
    ``warmup`` batches are not timed. Every
    contender runs ``repeats`` times, in alternating order. ``drop_caches``: drop the page cache
    before every run (cold cache) where permitted; otherwise all files are read once first (warm).
    ``jpeg_restart``: pack with :attr:`PackOptions.jpeg_restart <shardkit.pack.PackOptions>`; given
    ``shards`` that already hold a pack must have been packed with the same value.

    COCO (``annotations`` set): ``imagefolder`` is the images directory, the contenders are
    torchvision ``CocoDetection`` (needs pycocotools) and ShardLoader on the COCO route, and on
    ``device="cuda"`` ShardLoader on the COCO GPU route too, all with the steps of
    ``transforms.detection_train(size, max_size)`` (IoU crop, shortest side ``size``, longer at
    most ``max_size``, flip, sanitize); ``transform`` does not apply.

    Captions (``captions=True``): ``imagefolder`` is a captioned source (a folder of images with
    ``.txt`` sidecars, a caption table or a saved HF dataset; :func:`shardkit.pack.pack_captions`),
    the contenders are plain webdataset over the packed shards (the baseline) and ShardLoader, both
    with the ``transform`` crop and every batch's captions tokenized in the workers to
    ``context_length`` ids (:class:`~shardkit.transforms.ByteTokenizer`).
    """

    imagefolder: str
    shards: str | None = None
    workers: int = 2
    batch_size: int = 64
    device: str = "cpu"
    transform: str = "train"
    size: int = 224
    epochs: int | None = None
    repeats: int = 3
    warmup: int = 5
    drop_caches: bool = False
    pack_workers: int | None = None
    contenders: tuple[str, ...] = CONTENDERS
    jpeg_restart: int | None = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    annotations: str | None = None
    max_size: int = 1333
    captions: bool = False
    context_length: int = 77

    def validate(self) -> None:
        """Raise ValueError on settings that cannot be benchmarked."""
        if self.transform not in ("train", "val"):
            raise ValueError(f"transform must be 'train' or 'val', got {self.transform!r}")
        if (min(self.batch_size, self.size, self.repeats) < 1 or (self.epochs is not None and self.epochs < 1)
                or self.workers < 0 or self.warmup < 0):
            raise ValueError("batch_size, size, epochs and repeats must be >= 1; workers and "
                             "warmup >= 0")
        if self.jpeg_restart is not None and self.jpeg_restart < 1:
            raise ValueError(f"jpeg_restart must be >= 1, got {self.jpeg_restart}")
        if self.captions:
            if self.annotations is not None:
                raise ValueError("captions and annotations exclude each other (a captioned source has no COCO file)")
            if self.context_length < 1:
                raise ValueError(f"context_length must be >= 1, got {self.context_length}")
            if "webdataset" not in self.contenders or set(self.contenders) - set(CAPTION_CONTENDERS):
                raise ValueError(f"caption contenders must include 'webdataset' and be among {CAPTION_CONTENDERS}, "
                                 f"got {self.contenders}")
            return
        if self.annotations is not None:
            if importlib.util.find_spec("pycocotools") is None:
                raise ValueError("the CocoDetection baseline needs pycocotools (pip install pycocotools)")
            if self.max_size < self.size:
                raise ValueError(f"max_size must be >= size for COCO, got size={self.size}, max_size={self.max_size}")
            return
        unknown = set(self.contenders) - set(CONTENDERS)
        if unknown or "imagefolder" not in self.contenders:
            raise ValueError(f"contenders must include 'imagefolder' and be among {CONTENDERS}, "
                             f"got {self.contenders}")
