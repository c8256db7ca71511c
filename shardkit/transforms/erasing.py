"""RandomErasing on a whole uint8 batch, with torchvision's parameters, on the batch's device.

torchvision's ``v2.RandomErasing`` (and timm's) draw a box per image in a Python loop; here every
image's ten tries are drawn at once and the boxes become one mask, so a ``[B, 3, H, W]`` batch
costs a few tensor ops wherever it lives (the CPU route's batch on the CPU, the GPU route's on
the GPU). It works on uint8 values: build the loader with ``normalize=False``, augment, then
normalise with :class:`~shardkit.transforms.batch.BatchFormat` (``BatchFormat.make(True, torch.float32, False)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["RandomErasing", "erasing_boxes"]


def erasing_boxes(batch: int, height: int, width: int, *, p: float, scale: tuple[float, float],
                  ratio: tuple[float, float], generator: torch.Generator | None = None) -> torch.Tensor:
    """int64 ``[batch, 4]`` boxes ``(top, left, h, w)``, ``h = w = 0`` for an image left alone.

    torchvision's ``RandomErasing.get_params`` per image: erased with probability ``p``; then up
    to ten tries of an area ``uniform(scale)`` times the image's and a log-uniform aspect
    ``ratio``, the first that fits strictly inside (``h < height and w < width``) placed
    uniformly; none fits: left alone. Drawn on the CPU from ``generator`` (torch's global one
    when None).

    Example:
        >>> erasing_boxes(2, 32, 32, p=1.0, scale=(0.02, 0.33), ratio=(0.3, 3.3),
        ...               generator=torch.Generator().manual_seed(0)).shape
        torch.Size([2, 4])
    """
    erase = torch.rand(batch, generator=generator) < p
    area = height * width * torch.empty(batch, 10, dtype=torch.float64).uniform_(*scale, generator=generator)
    log_ratio = torch.empty(batch, 10, dtype=torch.float64).uniform_(math.log(ratio[0]), math.log(ratio[1]),
                                                                     generator=generator)
    aspect = log_ratio.exp()
    h = (area * aspect).sqrt().round().long()
    w = (area / aspect).sqrt().round().long()
    fits = (h < height) & (w < width) & (h > 0) & (w > 0)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)  # the first try that fits (0 when none does)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    keep = erase & fits.any(dim=1)
    h, w = h * keep, w * keep
    top = (torch.rand(batch, generator=generator, dtype=torch.float64) * (height - h + 1)).long()
    left = (torch.rand(batch, generator=generator, dtype=torch.float64) * (width - w + 1)).long()
    return torch.stack([top, left, h, w], dim=1)


@dataclass(frozen=True)
class RandomErasing:
    """``v2.RandomErasing(p, scale, ratio, value)`` for a uint8 ``[B, 3, H, W]`` batch, each image
    its own box (see :func:`erasing_boxes`).

    ``value``: an int in ``[0, 255]`` or one per channel; ``"random"``: each erased pixel uniform
    in ``[0, 255]`` (timm's ``mode="pixel"`` on uint8; torchvision's ``"random"`` draws normal
    values, meaningful only after normalisation).

    Example:
        >>> import torch
        >>> from shardkit.transforms import RandomErasing
        >>> x = torch.full((4, 3, 16, 16), 200, dtype=torch.uint8)
        >>> y = RandomErasing(p=1.0)(x, torch.Generator().manual_seed(0))
        >>> bool((y == 0).any()), y.dtype
        (True, torch.uint8)
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: int | tuple[int, int, int] | str = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {self.p}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"scale must be (lo, hi) with 0 < lo <= hi <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must be (lo, hi) with 0 < lo <= hi, got {self.ratio}")
        values = [self.value] if isinstance(self.value, int) else self.value
        if self.value != "random" and (isinstance(values, str) or len(values) not in (1, 3)
                                       or not all(isinstance(v, int) and 0 <= v <= 255 for v in values)):
            raise ValueError(f"value must be an int in [0, 255], three of them or 'random', got {self.value!r}")

    def __call__(self, batch: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A new uint8 batch with each image's box erased (``batch`` is left as it is)."""
        if batch.dtype != torch.uint8 or batch.dim() != 4 or batch.shape[1] != 3:
            raise ValueError(f"expected a uint8 [B, 3, H, W] batch, got {batch.dtype} {list(batch.shape)}")
        n, _, height, width = batch.shape
        boxes = erasing_boxes(n, height, width, p=self.p, scale=self.scale, ratio=self.ratio, generator=generator)
        if batch.device.type == "cpu":  # a copy, then each box filled in place: no pass over a mask
            return self._fill_boxes(batch.clone(), boxes, generator)
        boxes = boxes.to(batch.device)
        top, left, h, w = (boxes[:, k].view(n, 1, 1, 1) for k in range(4))
        rows = torch.arange(height, device=batch.device).view(1, 1, height, 1)
        cols = torch.arange(width, device=batch.device).view(1, 1, 1, width)
        inside = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)
        if self.value == "random":
            fill = torch.randint(0, 256, tuple(batch.shape), generator=generator, dtype=torch.uint8).to(batch.device)
        else:
            fill = torch.tensor(self.value, dtype=torch.uint8, device=batch.device).view(1, -1, 1, 1)
        return torch.where(inside, fill, batch)

    def _fill_boxes(self, out: torch.Tensor, boxes: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Fill each image's box of ``out`` (on the CPU) in place: the value, or uniform noise."""
        for i, (top, left, h, w) in enumerate(boxes.tolist()):
            if h == 0:
                continue
            region = out[i, :, top : top + h, left : left + w]
            if self.value == "random":
                region.copy_(torch.randint(0, 256, tuple(region.shape), generator=generator, dtype=torch.uint8))
            else:
                region.copy_(torch.tensor(self.value, dtype=torch.uint8).view(-1, 1, 1).expand_as(region))
        return out
