"""Resize shorter side then centre crop (the ImageNet eval transform), as a source-pixel box."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from shardkit.transforms.base import ImageTransform, size_pair
from shardkit.transforms.batch import BatchFormat
from shardkit.transforms.gpu import Window
from shardkit.transforms.ops import INTERPOLATIONS, crop_resize_flip, resize_uint8
from shardkit.transforms.params import CropFlip

_UNUSED = random.Random(0)  # sample_params of a centre crop draws nothing

__all__ = ["ResizeCenterCrop", "resize_center_crop_box"]


def _resized_size(height: int, width: int, resize_to: int) -> tuple[int, int]:
    # torchvision's _compute_resized_output_size for an int size
    if width <= height:
        return int(resize_to * height / width), resize_to
    return resize_to, int(resize_to * width / height)


def resize_center_crop_box(
    height: int, width: int, resize_to: int, crop: tuple[int, int]
) -> tuple[int, int, int, int]:
    """The source box ``(top, left, h, w)`` that ``v2.Resize(resize_to)`` + ``CenterCrop(crop)``
    keeps.

    The shorter side is resized as torchvision does (longer side ``int(resize_to * long / short)``),
    the crop offset rounded as ``CenterCrop`` does, and the box mapped back to source pixels and
    rounded to whole pixels (clamped inside the image).

    Example:
        >>> resize_center_crop_box(375, 500, 256, (224, 224))
        (23, 85, 329, 328)
    """
    new_h, new_w = _resized_size(height, width, resize_to)
    box = []
    for src, new, out in ((height, new_h, crop[0]), (width, new_w, crop[1])):
        off = int(round((new - out) / 2.0))
        lo = max(0, round(off * src / new))
        hi = min(src, max(lo + 1, round((off + out) * src / new)))
        box.append((lo, hi - lo))
    return box[0][0], box[1][0], box[0][1], box[1][1]


@dataclass(frozen=True)
class ResizeCenterCrop(ImageTransform):
    """``v2.Compose([Resize(resize_to), CenterCrop(output_size)])``, equal to torchvision's values.

    ``sample_params`` gives the source box the centre crop keeps, rounded to whole pixels (for
    the GPU path). Resizing just that box is not exact: the rounding shifts the sampling grid by
    up to half a source pixel, which costs up to ~2 levels mean absolute difference on sharp
    photos (e.g. skimage's motorcycle). So :meth:`apply`, given exactly that box, resizes the
    whole image and crops, as torchvision does (~1.7x the resize work of the box); any other
    box goes through the generic crop-resize-flip. No randomness; ``rng`` is not drawn from.

    Example:
        >>> import random
        >>> from shardkit.transforms import ResizeCenterCrop
        >>> ResizeCenterCrop((224, 224), 256).sample_params(375, 500, random.Random(0))
        CropFlip(top=23, left=85, height=329, width=328, flip=False)
    """

    output_size: tuple[int, int]
    resize_to: int
    batch_format: BatchFormat = field(default_factory=BatchFormat)
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        object.__setattr__(self, "output_size", size_pair(self.output_size))  # an int n: (n, n)
        if self.resize_to < max(self.output_size):
            raise ValueError(f"resize_to ({self.resize_to}) must be >= the crop {self.output_size}")

    def sample_params(self, height: int, width: int, rng: random.Random) -> CropFlip:
        """The fixed centre box for a ``height x width`` image (no flip)."""
        return CropFlip(*resize_center_crop_box(height, width, self.resize_to, self.output_size))

    def draw(self, height: int, width: int, seed: int) -> CropFlip:
        """The centre box: nothing is drawn, so no generator is seeded (see :meth:`sample_params`)."""
        if type(self).sample_params is not ResizeCenterCrop.sample_params:  # a subclass that draws
            return super().draw(height, width, seed)
        return self.sample_params(height, width, _UNUSED)

    def gpu_window(self, height: int, width: int, params: CropFlip) -> Window:
        """For its own centre box: the resize of the whole image, cropped at the centre offset
        (what :meth:`apply` computes); any other box: resized to ``output_size`` and flipped."""
        if params != self.sample_params(height, width, _UNUSED):
            return super().gpu_window(height, width, params)
        new_h, new_w = _resized_size(height, width, self.resize_to)
        size = self.output_size
        top, left = int(round((new_h - size[0]) / 2.0)), int(round((new_w - size[1]) / 2.0))
        return (height, width, 0, 0, height, width, new_h, new_w, top, left, 0)

    def apply(self, image: torch.Tensor, params: CropFlip,
              out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 ``[3, H, W]`` -> uint8 ``[3, *output_size]``; exact for ``sample_params``' box."""
        height, width = image.shape[-2], image.shape[-1]
        if image.dim() != 3 or params != self.sample_params(height, width, _UNUSED):
            return super().apply(image, params, out)
        new_h, new_w = _resized_size(height, width, self.resize_to)
        (oh, ow), sized = self.output_size, resize_uint8(image, (new_h, new_w), self.interpolation)
        top, left = int(round((new_h - oh) / 2.0)), int(round((new_w - ow) / 2.0))
        return crop_resize_flip(sized, CropFlip(top, left, oh, ow), self.output_size, out)
