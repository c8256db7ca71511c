"""Ready-made ImageNet train/eval transforms with torchvision's parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardkit.transforms.batch import BatchFormat
from shardkit.transforms.center_crop import ResizeCenterCrop
from shardkit.transforms.random_resized_crop import RandomResizedCropFlip

__all__ = ["imagenet_train", "imagenet_val"]

Normalize = bool | tuple[Sequence[float], Sequence[float]]


def imagenet_train(
    size: int = 224,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_p: float = 0.5,
    normalize: Normalize = False,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    interpolation: str = "bilinear",
) -> RandomResizedCropFlip:
    """``RandomResizedCrop(size, scale, ratio, interpolation)`` + ``RandomHorizontalFlip(flip_p)``, uint8 out.

    ``normalize``: False (batches stay uint8), True (ImageNet mean/std) or ``(mean, std)`` on a
    0–1 scale, applied by ``finalize`` on the device and returned as ``dtype`` (default float32;
    bfloat16 or float16 too). ``dtype`` without ``normalize`` is refused: batches stay uint8.
    ``channels_last``: ``finalize`` returns channels-last memory. ``interpolation``:
    ``"bilinear"`` (torchvision's default) or ``"bicubic"`` (what most timm pretrained
    configurations name), antialiased either way; bicubic resizes on the CPU route only (a CUDA
    loader takes it, with one warning).

    Example:
        >>> t = imagenet_train(224, normalize=True)
        >>> t.output_size
        (224, 224)
    """
    fmt = BatchFormat.make(normalize, dtype, channels_last)
    return RandomResizedCropFlip((size, size), scale, ratio, flip_p, fmt, interpolation)


def imagenet_val(
    size: int = 224,
    *,
    crop_fraction: float = 0.875,
    normalize: Normalize = False,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    interpolation: str = "bilinear",
) -> ResizeCenterCrop:
    """``Resize(int(size / crop_fraction), interpolation)`` + ``CenterCrop(size)``, uint8 out (crop
    first). timm's evaluation of a model is ``imagenet_val(size, crop_fraction=crop_pct,
    interpolation=...)`` with the model's ``pretrained_cfg`` values (often ``"bicubic"``).
    ``normalize``, ``dtype`` and ``channels_last`` as :func:`imagenet_train`'s.

    Example:
        >>> imagenet_val(224).resize_to
        256
    """
    if not 0 < crop_fraction <= 1:
        raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
    fmt = BatchFormat.make(normalize, dtype, channels_last)
    return ResizeCenterCrop((size, size), int(size / crop_fraction), fmt, interpolation)
