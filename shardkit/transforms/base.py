"""The contract the loader relies on: sample parameters, apply them per image, finalise batches."""

from __future__ import annotations

import abc
import operator
import random
from typing import ClassVar

import torch

from shardkit.transforms.batch import BatchFormat
from shardkit.transforms.gpu import Window, window_geometry
from shardkit.transforms.ops import crop_resize_flip
from shardkit.transforms.params import CropFlip

__all__ = ["ImageTransform", "size_pair"]


def size_pair(size: object) -> tuple[int, int]:
    """``output_size`` as ``(height, width)``: an int ``n`` (numpy's, a 0-d tensor) or ``[n]`` is
    ``(n, n)``, and any two whole numbers (a tuple, list, array or tensor) are ``(h, w)``, as
    torchvision's transforms take them.

    >>> size_pair(32), size_pair([24, 32]), size_pair([16])
    ((32, 32), (24, 32), (16, 16))
    >>> size_pair("32")
    Traceback (most recent call last):
    ValueError: output_size must be a positive int or (height, width), got '32'
    """

    def whole(value: object) -> int | None:  # an int (numpy's, a 0-d tensor's), not a bool, a float or text
        if isinstance(value, (bool, str, bytes, bytearray)) or "bool" in str(getattr(value, "dtype", "")):
            return None
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            return None

    one = whole(size)
    parts: list[int | None] = [one, one] if one is not None else [None]
    if one is None and not isinstance(size, (str, bytes, bytearray)):
        try:
            items = list(size)  # type: ignore[call-overload]
        except TypeError:
            items = []
        if len(items) in (1, 2):
            parts = [whole(v) for v in items] * (3 - len(items))
    if len(parts) != 2 or not all(v is not None and v > 0 for v in parts):
        raise ValueError(f"output_size must be a positive int or (height, width), got {size!r}")
    return int(parts[0]), int(parts[1])  # type: ignore[arg-type]


class ImageTransform(abc.ABC):
    """A crop-resize-flip image transform, split so each step can run where it is cheapest.

    * :meth:`sample_params` (CPU worker, seeded ``random.Random``, header size only) picks a
      :class:`CropFlip`; the same generator state always gives the same parameters. Workers
      call it through :meth:`draw`, with the sample's seed.
    * :meth:`apply` crops, resizes the crop to :attr:`output_size` and flips, writing into
      ``out`` when given (e.g. one slice of a pinned batch buffer).
    * :meth:`finalize` runs once per batch on the target device (normalise, cast, layout).

    Subclasses are frozen dataclasses with ``output_size`` and ``batch_format`` fields, so they
    pickle to worker processes.

    Example:
        >>> import random  # doctest: +SKIP
        >>> t = imagenet_train(224)  # doctest: +SKIP
        >>> p = t.sample_params(375, 500, random.Random(0))  # doctest: +SKIP
        >>> t.apply(img, p, out=batch[i])  # doctest: +SKIP
    """

    output_size: tuple[int, int]
    batch_format: BatchFormat
    #: The resize filter (:data:`~shardkit.transforms.ops.INTERPOLATIONS`); the GPU routes resize
    #: bilinear only, so a loader on a CUDA device takes the CPU route for any other.
    interpolation: str = "bilinear"
    #: True when :meth:`apply` reads only the pixels inside the parameters' box, so a loader
    #: may decode just that region (see ``shardkit.codec.jpeg_region``) and apply with the box moved
    #: to the origin. False (e.g. resize-then-centre-crop) means the whole image is needed.
    crop_first: ClassVar[bool] = False

    @abc.abstractmethod
    def sample_params(self, height: int, width: int, rng: random.Random) -> CropFlip:
        """The crop box and flip for a ``height x width`` image; the box lies inside the image."""

    def draw(self, height: int, width: int, seed: int) -> CropFlip:
        """The parameters of the sample whose augmentation seed is ``seed``: what
        :meth:`sample_params` draws from a fresh ``random.Random(seed)``. The loader's workers
        call this once per image; a transform may compute the same parameters faster."""
        return self.sample_params(height, width, random.Random(seed))

    def apply(self, image: torch.Tensor, params: CropFlip,
              out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 ``[3, H, W]`` -> uint8 ``[3, *output_size]``; see :func:`crop_resize_flip`."""
        return crop_resize_flip(image, params, self.output_size, out, self.interpolation)

    def __call__(self, image: torch.Tensor, rng: random.Random | None = None) -> torch.Tensor:
        """``apply(image, sample_params(H, W, rng))``.

        Raises:
            TypeError: no ``rng``: called from a function of the user's, where the loader can
                neither seed its draws per sample nor finalise its batches (``normalize``,
                ``dtype``, ``channels_last``); said with what to do instead.
        """
        if rng is None:
            raise TypeError(f"{type(self).__name__} is called by the loader, which gives it each sample's "
                            "random.Random and finalises its batches (normalize, dtype, channels_last): pass it "
                            "as transform= itself; to add steps of your own, use torchvision's v2 transforms in "
                            "your function (torchvision.transforms.v2.RandomResizedCrop, ...), or do them on each "
                            "batch in your loop")
        return self.apply(image, self.sample_params(image.shape[-2], image.shape[-1], rng))

    def gpu_window(self, height: int, width: int, params: CropFlip) -> Window:
        """The GPU route's geometry row (without ``dest``, see :mod:`shardkit.transforms.gpu`) that
        reproduces :meth:`apply` of ``params`` on a ``height x width`` image: by default the box
        resized to :attr:`output_size` and flipped. Transforms whose ``apply`` computes something
        else for some boxes override this (the centre crop does)."""
        return window_geometry(height, width, params, self.output_size)

    def finalize(self, batch: torch.Tensor) -> torch.Tensor:
        """Apply :attr:`batch_format` to a uint8 ``[B, 3, *output_size]`` batch on its device."""
        return self.batch_format(batch)
