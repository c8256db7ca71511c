"""The COCO route: workers decode, build targets and run the detection transform; the host
moves images and targets to the device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardkit.index.manifest import Manifest
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.base import DirectRoute, to_device
from shardkit.loader.routes.coco.target import contiguous_label_map
from shardkit.loader.routes.coco.worker import DetectionBatch, DetectionBatchBuilder

__all__ = ["CocoRoute", "coco_labels"]


def coco_labels(manifest: Manifest, contiguous: bool) -> tuple[dict[Any, int] | None, tuple[str, ...] | None]:
    """``(label_map, classes)`` of a COCO dataset: with ``contiguous``, category id -> 1..K and
    ``("__background__", *names by label)``; otherwise ``(None, None)`` (labels are the ids)."""
    if not contiguous:
        return None, None
    label_map = contiguous_label_map(manifest.categories)
    names = {c["id"]: str(c.get("name", c["id"])) for c in manifest.categories or ()}
    by_label = sorted(label_map, key=label_map.__getitem__)
    return label_map, ("__background__", *(names[cid] for cid in by_label))


class CocoRoute(DirectRoute[DetectionBatch]):
    """Detection batches ``(images, targets)`` of a COCO dataset (see :class:`DetectionBatchBuilder`).

    ``contiguous_labels``: labels 1..K in category-id order (0: background) instead of the
    category ids; the mapping is :attr:`label_map`.
    """

    def __init__(self, manifest: Manifest, reader: ShardReader, transform: Callable[..., Any] | None, *,
                 device: torch.device, on_error: str, masks: bool, pad: bool | int, contiguous_labels: bool) -> None:
        #: category id -> label when ``contiguous_labels``; otherwise None (labels are the ids).
        self.label_map, self.classes = coco_labels(manifest, contiguous_labels)
        self.builder: DetectionBatchBuilder = DetectionBatchBuilder(
            reader, transform, on_error=on_error, masks=masks, label_map=self.label_map, pad=int(pad))
        self.device = device
        self.pin_memory = device.type == "cuda"

    def finish(self, batch: DetectionBatch) -> tuple[Any, Any]:
        images, targets = batch.unpack()
        return to_device(images, self.device), to_device(targets, self.device)
