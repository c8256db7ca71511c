"""A detection batch packed for the trip from a worker process to the loader's process.

torch sends every tensor between processes as its own shared-memory segment, one file
descriptor round trip each: a batch of 4 images with 4 target tensors per image was 20 of them,
and receiving them took most of the main process's time at 800/1333 (profiled: ~1 ms each on
our loaded 2-core box, 2.9 ms of CPU per image). Packed, a batch is one tensor of pixels
(:class:`PackedPlanes`), one of masks when asked for, and numpy arrays for the targets
(:class:`PackedTargets`, pickled with the batch); :meth:`PackedTargets.unpack` and
:meth:`PackedPlanes.unpack` give back the per-image tensors as views.

Example:
    >>> t = {"image_id": 3, "boxes": torch.ones(2, 4), "labels": torch.tensor([1, 2]),
    ...      "area": torch.tensor([1.0, 2.0]), "iscrowd": torch.tensor([0, 0])}
    >>> targets = PackedTargets.of([t, {**t, "image_id": 4}]).unpack()
    >>> [x["image_id"] for x in targets], targets[1]["labels"].tolist()
    ([3, 4], [1, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["PackedPlanes", "PackedTargets"]

#: Per-box target entries and their dtypes, in the order targets list them.
FIELDS = {"boxes": np.float32, "labels": np.int64, "area": np.float32, "iscrowd": np.int64}


@dataclass
class PackedPlanes:
    """uint8 ``[k, h, w]`` tensors (images, masks) back to back in one 1-D ``data`` tensor.

    ``shapes[i]`` is tensor i's shape; ``hwc[i]`` says it was stored in HWC order (tensors whose
    memory is channels-last travel as they are, rather than being transposed: they come back
    with the same strides).
    """

    data: torch.Tensor
    shapes: list[tuple[int, int, int]]
    hwc: list[bool]

    @staticmethod
    def of(planes: Sequence[torch.Tensor]) -> PackedPlanes:
        hwc = [p.dim() == 3 and p.shape[0] > 1 and p.permute(1, 2, 0).is_contiguous() for p in planes]
        flat = [p.permute(1, 2, 0).reshape(-1) if h else p.reshape(-1) for p, h in zip(planes, hwc, strict=True)]
        data = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8)
        return PackedPlanes(data, [(int(p.shape[0]), int(p.shape[1]), int(p.shape[2])) for p in planes], hwc)

    def unpack(self) -> list[torch.Tensor]:
        """The tensors, as views of ``data``."""
        out, pos = [], 0
        for (k, h, w), hwc in zip(self.shapes, self.hwc, strict=True):
            part = self.data[pos:pos + k * h * w]
            out.append(part.view(h, w, k).permute(2, 0, 1) if hwc else part.view(k, h, w))
            pos += k * h * w
        return out

    def pin_memory(self) -> PackedPlanes:
        return PackedPlanes(self.data.pin_memory(), self.shapes, self.hwc)


@dataclass
class PackedTargets:
    """A batch's targets: ``image_ids`` and ``counts`` (boxes per image), then every image's
    entries of :data:`FIELDS` concatenated in batch order (numpy, pickled with the batch), and
    ``masks`` (one ``[N_i, H, W]`` per image) when the targets have them."""

    image_ids: list[Any]
    counts: np.ndarray
    fields: dict[str, np.ndarray]
    masks: PackedPlanes | None = None

    @staticmethod
    def of(targets: Sequence[dict[str, Any]], masks: bool = False) -> PackedTargets:
        def cat(key: str) -> np.ndarray:
            parts = [np.asarray(t[key], dtype=FIELDS[key]).reshape(-1, 4) if key == "boxes"
                     else np.asarray(t[key], dtype=FIELDS[key]).reshape(-1) for t in targets]
            empty = np.zeros((0, 4) if key == "boxes" else (0,), dtype=FIELDS[key])
            return np.concatenate(parts) if parts else empty

        counts = np.array([len(t["boxes"]) for t in targets], dtype=np.int64)
        planes = PackedPlanes.of([t["masks"] for t in targets]) if masks else None
        return PackedTargets([t["image_id"] for t in targets], counts, {k: cat(k) for k in FIELDS}, planes)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Each field of the whole batch as one CPU tensor (sharing the numpy arrays' memory)."""
        return {k: torch.from_numpy(v) for k, v in self.fields.items()}

    def unpack(self, fields: dict[str, torch.Tensor] | None = None,
               masks: Sequence[torch.Tensor] | None = None) -> list[dict[str, Any]]:
        """Per-image dicts ``{image_id, boxes, labels, area, iscrowd[, masks]}`` whose tensors are
        views of ``fields`` (default: :meth:`tensors`; e.g. those tensors moved to a device)
        and ``masks`` (default: the packed masks, if any)."""
        fields = self.tensors() if fields is None else fields
        counts = self.counts.tolist()
        split = {k: v.split(counts) for k, v in fields.items()}
        if masks is None and self.masks is not None:
            masks = self.masks.unpack()
        out = []
        for i, image_id in enumerate(self.image_ids):
            target = {"image_id": image_id, **{k: split[k][i] for k in FIELDS}}
            if masks is not None:
                target["masks"] = masks[i]
            out.append(target)
        return out
