"""ColorJitter's brightness, contrast and saturation on a whole uint8 batch, each image its own
factors and order, with torchvision's parameters and arithmetic, on the batch's device.

torchvision's ``v2.ColorJitter`` draws one set of factors per call, so a batch gets one jitter
for all its images; per image it is a Python loop. Here the factors of every image are drawn at
once and each op is one blend over the batch (per-image factors broadcast), with torchvision's
uint8 rounding, so an image equals ``v2.functional.adjust_*`` with its factors in its order
(saturation and contrast: a rare pixel one level off, where float rounding lands on an integer).
Hue is not offered (its HSV round trip is another kernel): use torchvision's per image for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ColorJitter", "adjust_brightness", "adjust_contrast", "adjust_saturation"]

_GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def _blend(image: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend`` on uint8 values held as float32 (``image`` is overwritten):
    ``factor * image + (1 - factor) * other``, clamped, truncated to integers."""
    f = factor.view(-1, 1, 1, 1)
    rest = (1.0 - f.double()).float()  # torchvision's 1 - ratio, in double then float
    return image.mul_(f).add_(other.mul(rest)).clamp_(0, 255).trunc_()


def _gray(image: torch.Tensor) -> torch.Tensor:
    """torchvision's uint8 grayscale of float32 values, ``[B, 1, H, W]`` (truncated to integers, as it does)."""
    r, g, b = image.unbind(dim=1)
    return r.mul(_GRAY[0]).add_(g, alpha=_GRAY[1]).add_(b, alpha=_GRAY[2]).trunc_().unsqueeze(1)


def _brightness(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return image.mul_(factor.view(-1, 1, 1, 1)).clamp_(0, 255).trunc_()


def _contrast(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(image, _gray(image).mean(dim=(1, 2, 3), keepdim=True), factor)


def _saturation(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(image, _gray(image), factor)


def adjust_brightness(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``v2.functional.adjust_brightness`` of each image of a uint8 batch by its own factor."""
    return _brightness(image.float(), factor).to(torch.uint8)


def adjust_contrast(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``v2.functional.adjust_contrast`` of each image of a uint8 batch by its own factor (blend
    with the image's mean grayscale)."""
    return _contrast(image.float(), factor).to(torch.uint8)


def adjust_saturation(image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``v2.functional.adjust_saturation`` of each image of a uint8 batch by its own factor (blend
    with its grayscale)."""
    return _saturation(image.float(), factor).to(torch.uint8)


_OPS = (_brightness, _contrast, _saturation)  # on float32 holding uint8 values, in place


def _range(name: str, value: float | tuple[float, float]) -> tuple[float, float] | None:
    """torchvision's reading of a jitter argument: ``v`` means ``[max(0, 1 - v), 1 + v]``; 0 or
    ``(1, 1)``: no jitter (None)."""
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        lo, hi = max(0.0, 1.0 - value), 1.0 + value
    else:
        lo, hi = float(value[0]), float(value[1])
        if not 0 <= lo <= hi:
            raise ValueError(f"{name} must be (lo, hi) with 0 <= lo <= hi, got {value}")
    return None if lo == hi == 1.0 else (lo, hi)


@dataclass(frozen=True)
class ColorJitter:
    """``v2.ColorJitter(brightness, contrast, saturation)`` for a uint8 ``[B, 3, H, W]`` batch:
    each image draws its three factors (uniform in torchvision's ranges) and the order of the
    ops (a random permutation, as torchvision), on the CPU from ``generator`` (torch's global one
    when None); the ops run where the batch is.

    Example:
        >>> import torch
        >>> from shardkit.transforms import ColorJitter
        >>> x = torch.full((4, 3, 8, 8), 100, dtype=torch.uint8)
        >>> y = ColorJitter(brightness=0.4)(x, torch.Generator().manual_seed(0))
        >>> len(set(y[:, 0, 0, 0].tolist())) > 1  # each image its own brightness
        True
    """

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            _range(name, getattr(self, name))

    def draw(self, batch: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(factors [batch, 3], order [batch, 3])``: each image's brightness, contrast and
        saturation factors (1 where not jittered) and the order its ops run in (a permutation
        of 0, 1, 2)."""
        factors = torch.ones(batch, 3, dtype=torch.float32)
        for k, name in enumerate(("brightness", "contrast", "saturation")):
            span = _range(name, getattr(self, name))
            if span is not None:
                factors[:, k].uniform_(*span, generator=generator)
        order = torch.rand(batch, 3, generator=generator).argsort(dim=1)
        return factors, order

    def __call__(self, batch: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A new uint8 batch, each image jittered by its own factors in its own order."""
        if batch.dtype != torch.uint8 or batch.dim() != 4 or batch.shape[1] != 3:
            raise ValueError(f"expected a uint8 [B, 3, H, W] batch, got {batch.dtype} {list(batch.shape)}")
        factors, order = self.draw(batch.shape[0], generator)
        if batch.device.type != "cpu":  # the whole batch at once: a few launches
            return _jitter(batch, factors.to(batch.device), order.to(batch.device))
        # on the CPU, one image at a time stays in cache (the whole batch in float32 does not)
        out = torch.empty_like(batch)
        for i, (ops, values) in enumerate(zip(order.tolist(), factors.tolist(), strict=True)):
            image = batch[i : i + 1].float()
            for op in ops:
                if values[op] != 1.0:
                    _OPS[op](image, factors[i : i + 1, op])
            out[i] = image[0]  # integer values: the uint8 conversion is exact
        return out


def _jitter(batch: torch.Tensor, factors: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Each image of ``batch`` jittered by its ``factors`` in its ``order`` (see :meth:`ColorJitter.draw`)."""
    out = batch.float()  # uint8 values in float32 between the ops (truncated as torchvision's uint8)
    for step in range(3):
        for op, adjust in enumerate(_OPS):
            rows = ((order[:, step] == op) & (factors[:, op] != 1.0)).nonzero()[:, 0]
            if len(rows) == len(out):
                adjust(out, factors[:, op])
            elif len(rows):
                out.index_copy_(0, rows, adjust(out.index_select(0, rows), factors[rows, op]))
    return out.to(torch.uint8)
