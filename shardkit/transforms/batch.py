"""What a transform does to whole batches on the target device: normalise, cast, memory format."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "BatchFormat"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@functools.lru_cache(maxsize=16)
def _affine(mean: tuple[float, ...], std: tuple[float, ...],
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # (x / 255 - mean) / std == (x - 255 * mean) * (1 / (255 * std)); made once per device so no
    # host-to-device copy (and sync) happens per batch.
    shift = torch.tensor([255.0 * m for m in mean], dtype=torch.float32).view(-1, 1, 1)
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32).view(-1, 1, 1)
    return shift.to(device), scale.to(device)


@dataclass(frozen=True)
class BatchFormat:
    """How a uint8 ``[B, 3, H, W]`` batch is finalised on its device.

    ``mean``/``std`` (0–1 scale, per channel) both ``None``: values stay uint8; otherwise
    ``(x / 255 - mean) / std`` computed in float32 and returned as ``dtype`` (float32, bfloat16,
    float16). ``channels_last=True`` returns channels-last memory; ``False`` keeps the batch's.

    Example:
        >>> import torch
        >>> from shardkit.transforms import IMAGENET_MEAN, IMAGENET_STD, BatchFormat
        >>> fmt = BatchFormat(mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=torch.bfloat16)
        >>> fmt(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)).dtype
        torch.bfloat16
    """

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False

    def __post_init__(self) -> None:
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither")
        if self.mean is not None and self.std is not None:
            if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
                raise ValueError(f"need 3 means and 3 positive stds, got {self.mean}, {self.std}")
            if not self.dtype.is_floating_point:
                raise ValueError(f"normalised output needs a floating dtype, got {self.dtype}")

    @classmethod
    def make(cls, normalize: bool | tuple[Sequence[float], Sequence[float]], dtype: torch.dtype | None,
             channels_last: bool) -> BatchFormat:
        """From preset arguments: ``normalize`` is False, True (ImageNet stats) or
        ``(mean, std)``; ``dtype`` the normalised batches' (None: float32), refused without
        ``normalize`` (batches stay uint8 then: a dtype would change nothing, without a word).

        >>> BatchFormat.make(False, torch.float32, False)
        Traceback (most recent call last):
        ValueError: dtype=torch.float32 applies with normalize (True, or (mean, std)): without it batches stay uint8
        """
        if normalize is False:
            if dtype is not None and dtype != torch.uint8:
                raise ValueError(f"dtype={dtype} applies with normalize (True, or (mean, std)): without it batches "
                                 "stay uint8")
            return cls(dtype=torch.uint8, channels_last=channels_last)
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalize is True else normalize
        return cls(tuple(map(float, mean)), tuple(map(float, std)), dtype or torch.float32, channels_last)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """Finalise a uint8 ``[B, 3, H, W]`` (or ``[3, H, W]``) tensor on its own device."""
        x = batch
        if self.mean is not None and self.std is not None:
            shift, scale = _affine(self.mean, self.std, batch.device)
            x = batch.to(torch.float32).sub_(shift).mul_(scale)
            if self.dtype != torch.float32:
                x = x.to(self.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x
