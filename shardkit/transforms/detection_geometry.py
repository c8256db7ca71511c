"""The geometry a detection transform gives one image, drawn without touching its pixels.

The COCO GPU route decodes, crops, resizes and flips images on the device, so its workers need,
per sample, what the CPU route's :func:`~shardkit.transforms.detection.run_detection_transform`
would do to the image (the crop box, the output size, the flip) and the transformed target,
from the same seeded draws. Rather than re-implement v2's ``RandomIoUCrop`` sampling loop (whose
draws depend on the boxes), :func:`draw_geometry` runs the transform itself, seeded the same
way, on a *stand-in image*: a zero-element ``tv_tensors.Image`` subclass of shape
``[0, 3, H, W]`` whose crop, resize and flip kernels (registered with
``torchvision.transforms.v2.functional.register_kernel``) only record what was asked and
return a stand-in of the new size. The boxes go through v2's own kernels and
``SanitizeBoundingBoxes``, so the target is bit-identical to the CPU route's, and so are the
random draws (they depend on the image size and the boxes only).

Which per-box entries survive sanitizing is learnt by passing ``labels = arange(N)`` through
the transform (sanitizing only indexes per-box tensors), so labels, area, iscrowd and masks
follow with the same rows.

Only transforms whose geometry is one crop-resize-flip window can run so:
:func:`gpu_unsupported` says why another cannot (the loader then keeps the CPU route).

Example:
    >>> import torch
    >>> from shardkit.transforms import detection_val
    >>> target = {"boxes": torch.tensor([[10.0, 20.0, 110.0, 220.0]]), "labels": torch.tensor([7])}
    >>> g = draw_geometry(detection_val(800, 1333), 400, 600, target, seed=0)
    >>> g.box, g.size, g.target["boxes"].tolist(), g.keep.tolist()
    (CropFlip(top=0, left=0, height=400, width=600, flip=False), (800, 1200), [[20.0, 40.0, 220.0, 440.0]], [0])
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from shardkit.transforms.detection import PER_BOX, DetectionTransform, _per_box, seeded_call
from shardkit.transforms.params import CropFlip

__all__ = ["Geometry", "draw_geometry", "gpu_unsupported"]

_CROPS = (v2.RandomIoUCrop,)
_RESIZES = (v2.RandomShortestSize, v2.ScaleJitter, v2.Resize)
_FLIPS = (v2.RandomHorizontalFlip,)
_BOX_ONLY = (v2.SanitizeBoundingBoxes, v2.ClampBoundingBoxes)


def _antialiased_bilinear(interpolation: Any, antialias: Any) -> bool:
    # v2 keeps the mode as given: an InterpolationMode or its string value
    mode = getattr(interpolation, "value", interpolation)
    return mode == v2.InterpolationMode.BILINEAR.value and antialias is True


def gpu_unsupported(transform: Any) -> str | None:
    """None when ``transform``'s geometry is one crop-resize-flip window per image (what the
    COCO GPU route runs on the device), else why not.

    Takes ``None`` and :class:`DetectionTransform`\\ s made of, in this order: at most one
    ``RandomIoUCrop``, at most one antialiased bilinear ``RandomShortestSize``, ``ScaleJitter``
    or ``Resize``, at most one ``RandomHorizontalFlip``; ``SanitizeBoundingBoxes`` and
    ``ClampBoundingBoxes`` anywhere (they touch boxes only). ``detection_train`` and
    ``detection_val`` build such transforms.

    Example:
        >>> from torchvision.transforms import v2
        >>> from shardkit.transforms import DetectionTransform
        >>> from shardkit.transforms import detection_train
        >>> gpu_unsupported(detection_train()) is None
        True
        >>> gpu_unsupported(DetectionTransform([v2.ColorJitter(0.1)], random=True))
        'ColorJitter changes pixels in a way the GPU route does not run'
    """
    if transform is None:
        return None
    if not isinstance(transform, DetectionTransform):
        return f"{type(transform).__name__} is not a DetectionTransform (transforms.detection_train/detection_val)"
    stage = 0  # 1: crop seen, 2: resize seen, 3: flip seen
    for op in transform.ops:
        name = type(op).__name__
        if isinstance(op, v2.SanitizeBoundingBoxes) and getattr(op, "labels_getter", None) is not _per_box:
            return f"{name} with another labels_getter than detection_train's (which entries follow the boxes)"
        if isinstance(op, _BOX_ONLY):
            continue
        kinds = ((_CROPS, 1), (_RESIZES, 2), (_FLIPS, 3))
        step = next((s for types, s in kinds if isinstance(op, types)), None)
        if step is None:
            return f"{name} changes pixels in a way the GPU route does not run"
        if step <= stage:
            return f"{name} after another crop, resize or flip: more than one crop-resize-flip window"
        if step == 2 and not _antialiased_bilinear(getattr(op, "interpolation", None), getattr(op, "antialias", None)):
            return f"{name} with interpolation {getattr(op, 'interpolation', None)} (the GPU route resizes " \
                   "antialiased bilinear only)"
        stage = step
    return None


class _StandIn(tv_tensors.Image):
    """A ``[0, 3, H, W]`` image: v2 sees its size, its kernels record instead of computing."""

    log: list[tuple[Any, ...]]

    @staticmethod
    def of(height: int, width: int, log: list[tuple[Any, ...]]) -> _StandIn:
        out = torch.empty((0, 3, height, width), dtype=torch.uint8).as_subclass(_StandIn)
        out.log = log
        return out

    def then(self, step: tuple[Any, ...], height: int, width: int) -> _StandIn:
        self.log.append(step)
        return _StandIn.of(height, width, self.log)


def _crop(image: _StandIn, top: int, left: int, height: int, width: int) -> _StandIn:
    return image.then(("crop", top, left, height, width), height, width)


def _resize(image: _StandIn, size: Sequence[int] | int | None, interpolation: Any = v2.InterpolationMode.BILINEAR,
            max_size: int | None = None, antialias: bool | None = True) -> _StandIn:
    # torchvision's own size arithmetic: its kernel on a zero-element tensor of the same shape
    shaped = F.resize(image.as_subclass(torch.Tensor), size=size, interpolation=interpolation,
                      max_size=max_size, antialias=antialias)
    height, width = int(shaped.shape[-2]), int(shaped.shape[-1])
    return image.then(("resize", height, width, interpolation, antialias), height, width)


def _flip(image: _StandIn) -> _StandIn:
    return image.then(("flip",), image.shape[-2], image.shape[-1])


@functools.cache
def _register() -> None:
    """Register the stand-in's kernels, once per process (workers may be spawned, not forked)."""
    F.register_kernel(F.crop, _StandIn)(_crop)
    F.register_kernel(F.resize, _StandIn)(_resize)
    F.register_kernel(F.horizontal_flip, _StandIn)(_flip)


@dataclass(frozen=True)
class Geometry:
    """What a detection transform does to one image: resize ``box`` (with its ``flip``) to
    ``size``; ``target`` is the transformed target (plain tensors, boxes float32), ``keep`` the
    int64 indices of the input's boxes it kept, in order."""

    box: CropFlip
    size: tuple[int, int]
    target: dict[str, Any]
    keep: torch.Tensor


def _window(height: int, width: int, log: list[tuple[Any, ...]]) -> tuple[CropFlip, tuple[int, int]]:
    top, left, box_h, box_w, size, flip, resized = 0, 0, height, width, (height, width), False, False
    for step in log:
        if step[0] == "crop":
            if resized or flip:
                raise ValueError(f"a crop after a resize or flip is not one window: {log}")
            _, t, lft, box_h, box_w = step
            if t < 0 or lft < 0 or t + box_h > size[0] or lft + box_w > size[1]:
                raise ValueError(f"crop {step[1:]} leaves the {size[0]}x{size[1]} image")
            top, left, size = top + t, left + lft, (box_h, box_w)
        elif step[0] == "resize":
            if resized or flip:
                raise ValueError(f"two resizes, or a resize after a flip, are not one window: {log}")
            _, h, w, interpolation, antialias = step
            if not _antialiased_bilinear(interpolation, antialias):
                raise ValueError(f"resize with {interpolation}, antialias={antialias}: not antialiased bilinear")
            size, resized = (h, w), True
        else:
            flip = not flip
    return CropFlip(top, left, box_h, box_w, flip), size


def draw_geometry(transform: DetectionTransform | None, height: int, width: int, target: dict[str, Any],
                  seed: int) -> Geometry:
    """Run ``transform`` on a stand-in ``height x width`` image and ``target``, seeded like
    :func:`~shardkit.transforms.detection.run_detection_transform`; see the module doc.

    Args:
        transform: a transform :func:`gpu_unsupported` accepts, or None (no change).
        height, width: the image's size (from its header).
        target: ``boxes`` float ``[N, 4]`` XYXY pixels and other entries; per-box tensors
            (``labels``, ``area``, ``iscrowd``: those ``detection_train``'s sanitizing drops
            with their boxes) come back with the kept rows. ``masks`` is not
            looked at (index it with ``keep``).
        seed: the sample's seed.
    Returns:
        The :class:`Geometry`: the same boxes and draws as the CPU route's.
    Raises:
        ValueError: the transform's steps are not one crop-resize-flip window (check
            :func:`gpu_unsupported` first).
    """
    n = int(target["boxes"].shape[0])
    keep = torch.arange(n, dtype=torch.int64)
    if transform is None or not transform.ops:
        return Geometry(CropFlip(0, 0, height, width), (height, width), dict(target), keep)
    _register()
    log: list[tuple[Any, ...]] = []
    boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=(height, width))
    _, out = seeded_call(transform, _StandIn.of(height, width, log), {"boxes": boxes, "labels": keep}, seed)
    kept = out["labels"].as_subclass(torch.Tensor)
    if kept.shape[0] != out["boxes"].shape[0]:
        raise ValueError("the transform drops boxes without their labels (SanitizeBoundingBoxes(labels_getter=None)?)")
    box, size = _window(height, width, log)
    result = {k: (v[kept] if k in PER_BOX and isinstance(v, torch.Tensor) else v)
              for k, v in target.items() if k != "masks"}
    result["boxes"] = out["boxes"].as_subclass(torch.Tensor).to(torch.float32)
    return Geometry(box, size, result, kept)
