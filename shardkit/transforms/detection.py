"""Detection transforms: boxes and masks move with the pixels (torchvision.transforms.v2).

A detection transform is any callable ``(image, target) -> (image, target)`` that
``torchvision.transforms.v2`` understands: the image arrives as a ``tv_tensors.Image``, the
target's ``boxes`` as ``tv_tensors.BoundingBoxes`` (XYXY, pixels) and ``masks`` as
``tv_tensors.Mask``. :func:`run_detection_transform` does that wrapping, runs the transform
with torch's CPU generator seeded by the sample's seed (and restored afterwards, so the caller's
global RNG is untouched) and unwraps the result to plain tensors.

Why seed torch's generator: v2's random transforms draw from it and take no generator argument.
Forking it around the call keeps the draws a pure function of the sample seed, whatever process
or worker runs the sample.

Per-box entries ``labels``, ``area`` and ``iscrowd`` are dropped together with the boxes that
:class:`~torchvision.transforms.v2.SanitizeBoundingBoxes` removes. ``area`` keeps the
annotation's value (the area on the original image, which COCO evaluation uses); transforms do
not rescale it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from shardkit.errors import LoaderError
from shardkit.transforms.iou_crop import IoUCrop
from shardkit.transforms.rng import seeded

__all__ = ["DetectionTransform", "detection_train", "detection_val", "run_detection_transform", "seeded_call"]

PER_BOX = ("labels", "area", "iscrowd")


def _per_box(inputs: Any) -> tuple[torch.Tensor, ...]:
    """labels_getter for SanitizeBoundingBoxes: every per-box tensor of the target."""
    target = inputs[1] if isinstance(inputs, tuple) else inputs
    return tuple(target[k] for k in PER_BOX if isinstance(target.get(k), torch.Tensor))


class DetectionTransform:
    """A picklable sequence of v2 transforms on ``(image, target)``; see the module doc.

    ``random`` says whether the output depends on the seed (False for pure resizes), so the
    loader can skip seeding. Call it through :func:`run_detection_transform`.

    Example:
        >>> from torchvision.transforms import v2
        >>> from shardkit.transforms import DetectionTransform
        >>> DetectionTransform([v2.RandomHorizontalFlip(0.5)], random=True).random
        True
    """

    def __init__(self, ops: Sequence[Callable[..., Any]], *, random: bool) -> None:
        self.ops = list(ops)
        self.random = random
        self._pipeline = v2.Compose(self.ops) if self.ops else None

    def __call__(self, image: Any, target: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if self._pipeline is None:
            return image, target
        out: tuple[Any, dict[str, Any]] = self._pipeline(image, target)
        return out

    def __repr__(self) -> str:
        return f"DetectionTransform({self.ops!r}, random={self.random})"


def detection_train(
    min_size: int | Sequence[int] = 800,
    max_size: int = 1333,
    *,
    flip_p: float = 0.5,
    iou_crop: bool = True,
    scale_jitter: tuple[float, float] | None = None,
) -> DetectionTransform:
    """Training augmentation for detection: IoU crop, resize, flip, drop degenerate boxes.

    Steps (all v2, boxes and masks follow the pixels):

    1. ``RandomIoUCrop()`` when ``iou_crop`` (SSD's crop; boxes whose centre falls outside the
       crop are removed in step 4), as :class:`~shardkit.transforms.iou_crop.IoUCrop`: the same
       draws and crops, sampled several times faster;
    2. ``RandomShortestSize(min_size, max_size)``: shorter side to ``min_size`` (one drawn at
       random when a sequence: multi-scale training), longer side at most ``max_size``; or, when
       ``scale_jitter=(lo, hi)`` is given, Large Scale Jitter instead:
       ``ScaleJitter((max_size, max_size), scale_jitter)`` (fit in a ``max_size`` square, times
       a factor drawn from ``[lo, hi]``);
    3. ``RandomHorizontalFlip(flip_p)``;
    4. ``SanitizeBoundingBoxes()``: drops boxes smaller than 1 px (with their labels, area,
       iscrowd and masks).

    Raises:
        ValueError: sizes not positive, ``flip_p`` outside [0, 1], bad ``scale_jitter``.
    Example:
        >>> t = detection_train(320, 512, scale_jitter=None)
        >>> t.random
        True
    """
    sizes = [min_size] if isinstance(min_size, int) else list(min_size)
    if not sizes or any(s < 1 for s in sizes) or max_size < 1:
        raise ValueError(f"min_size and max_size must be positive, got {min_size!r}, {max_size!r}")
    if not 0.0 <= flip_p <= 1.0:
        raise ValueError(f"flip_p must be in [0, 1], got {flip_p}")
    ops: list[Callable[..., Any]] = [IoUCrop()] if iou_crop else []
    if scale_jitter is not None:
        lo, hi = scale_jitter
        if not 0 < lo <= hi:
            raise ValueError("scale_jitter must be (lo, hi) with 0 < lo <= hi, got "
                             f"{scale_jitter!r}")
        ops.append(v2.ScaleJitter((max_size, max_size), scale_range=(lo, hi)))
    else:
        ops.append(v2.RandomShortestSize(sizes, max_size=max_size))
    ops += [v2.RandomHorizontalFlip(flip_p), v2.SanitizeBoundingBoxes(labels_getter=_per_box)]
    return DetectionTransform(ops, random=True)


def detection_val(min_size: int | None = None, max_size: int | None = None) -> DetectionTransform:
    """Evaluation transform, sized like :func:`detection_train`: nothing (``min_size=None``) or
    ``Resize(min_size, max_size=max_size)`` (shorter side to ``min_size``, longer side at most
    ``max_size``: what torchvision's detection models do to their inputs at 800/1333; with
    ``max_size == min_size``, longer side to ``max_size``, as those models do then).

    With ``min_size=None`` the loader's targets equal torchvision's ``CocoDetection`` wrapped by
    ``wrap_dataset_for_transforms_v2`` (crowd and degenerate boxes kept, as there).

    Raises:
        ValueError: a size that is not positive, or ``max_size`` without ``min_size`` or below it.
    Example:
        >>> detection_val(800, 1333).random
        False
    """
    if min_size is None:
        if max_size is not None:
            raise ValueError("max_size needs min_size (detection_val(min_size, max_size))")
        return DetectionTransform([], random=False)
    if min_size < 1 or (max_size is not None and max_size < min_size):
        raise ValueError(f"need 1 <= min_size <= max_size, got min_size={min_size}, max_size={max_size}")
    if max_size == min_size:  # v2.Resize wants max_size above size; the longer side is what binds then
        return DetectionTransform([v2.Resize(None, max_size=max_size)], random=False)
    return DetectionTransform([v2.Resize(min_size, max_size=max_size)], random=False)


def run_detection_transform(transform: Callable[..., Any], image: torch.Tensor,
                            target: dict[str, Any],
                            seed: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """Wrap into tv_tensors, run ``transform`` seeded by ``seed``, unwrap to plain tensors.

    Args:
        transform: a :class:`DetectionTransform` or any v2-style ``(image, target)`` callable.
        image: uint8 ``[3, H, W]``.
        target: ``boxes`` float ``[N, 4]`` XYXY pixels, optional ``masks`` ``[N, H, W]``, other
            entries passed through (per-box tensors are sanitized with the boxes).
        seed: the sample's seed; torch's CPU generator is seeded with it for the call and
            restored afterwards.
    Returns:
        ``(image, target)`` with plain tensors; ``boxes`` float32.
    """
    h, w = image.shape[-2:]
    wrapped = dict(target)
    wrapped["boxes"] = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=(h, w))
    if "masks" in target:
        wrapped["masks"] = tv_tensors.Mask(target["masks"])
    result = seeded_call(transform, tv_tensors.Image(image), wrapped, seed)
    if result is None:
        raise LoaderError("the transform returned None (a function without a return?); a detection transform returns "
                          "(image, target)")
    out_image, out_target = result
    plain = {k: v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v
             for k, v in out_target.items()}
    plain["boxes"] = plain["boxes"].to(torch.float32)
    return out_image.as_subclass(torch.Tensor), plain


def seeded_call(transform: Callable[..., Any], image: Any, target: dict[str, Any], seed: int) -> tuple[Any, Any]:
    """``transform(image, target)`` with the global generators seeded by ``seed`` (restored
    afterwards: :func:`~shardkit.transforms.rng.seeded`); unseeded when the transform says it is
    not ``random``. The one place both routes draw a sample's detection augmentation (see the
    module doc)."""
    if not getattr(transform, "random", True):
        return transform(image, target)
    with seeded(seed):
        return transform(image, target)
