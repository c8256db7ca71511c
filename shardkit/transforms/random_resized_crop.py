"""RandomResizedCrop + horizontal flip with torchvision's parameters, drawn from a random.Random.

From a sample's seed (:meth:`RandomResizedCropFlip.draw`) the C extension ``_draws`` computes the
same parameters where it is built, bit for bit (tested against Python on random sizes, seeds,
scales and ratios), in half the time.
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from shardkit.transforms.base import ImageTransform, size_pair
from shardkit.transforms.batch import BatchFormat
from shardkit.transforms.ops import INTERPOLATIONS
from shardkit.transforms.params import CropFlip

__all__ = ["RandomResizedCropFlip", "random_resized_crop_box"]

#: ``_draws.random_resized_crop_flip``, or None where the C extension is not built.
_crop_flip: Callable[..., tuple[int, int, int, int, bool]] | None
try:
    _crop_flip = importlib.import_module("shardkit.transforms._draws").random_resized_crop_flip
except ImportError:  # not built: random.Random draws
    _crop_flip = None


def random_resized_crop_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: random.Random,
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` by torchvision's ``RandomResizedCrop.get_params`` algorithm.

    Ten tries at a box of ``scale`` times the area and log-uniform aspect ``ratio`` that fits,
    then a centre crop clamped to ``ratio``. Draws only from ``rng``.

    Example:
        >>> import random
        >>> random_resized_crop_box(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), random.Random(0))
        (3, 5, 372, 432)
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


@dataclass(frozen=True)
class RandomResizedCropFlip(ImageTransform):
    """``v2.RandomResizedCrop(output_size, scale, ratio)`` then ``v2.RandomHorizontalFlip(flip_p)``.

    Same parameter distribution and (antialiased bilinear, or ``interpolation="bicubic"``) resize
    as torchvision; randomness
    comes only from the ``random.Random`` passed in: a box, then one ``rng.random()`` for the flip.

    Example:
        >>> import random
        >>> from shardkit.transforms import RandomResizedCropFlip
        >>> t = RandomResizedCropFlip((224, 224))
        >>> t.sample_params(375, 500, random.Random(0)).height
        372
    """

    crop_first: ClassVar[bool] = True

    output_size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    batch_format: BatchFormat = field(default_factory=BatchFormat)
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        object.__setattr__(self, "output_size", size_pair(self.output_size))  # an int n: (n, n)
        if not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"scale must be (lo, hi) with 0 < lo <= hi, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must be (lo, hi) with 0 < lo <= hi, got {self.ratio}")
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {self.flip_p}")

    def sample_params(self, height: int, width: int, rng: random.Random) -> CropFlip:
        """A random box (inside the image) and flip; see :func:`random_resized_crop_box`."""
        top, left, h, w = random_resized_crop_box(height, width, self.scale, self.ratio, rng)
        return CropFlip(top, left, h, w, flip=rng.random() < self.flip_p)

    def draw(self, height: int, width: int, seed: int) -> CropFlip:
        """``sample_params(height, width, random.Random(seed))``, computed in C where it can be
        (see the module; a subclass that draws otherwise keeps its own :meth:`sample_params`)."""
        if _crop_flip is not None and type(self).sample_params is RandomResizedCropFlip.sample_params:
            try:
                top, left, h, w, flip = _crop_flip(height, width, seed, *self.scale, *self.ratio, self.flip_p)
            except (OverflowError, ValueError, TypeError):  # a seed outside [0, 2**64), a size it does not take
                return super().draw(height, width, seed)
            return CropFlip(top, left, h, w, flip)
        return super().draw(height, width, seed)
