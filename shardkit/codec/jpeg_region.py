"""Decode only the crop box a transform needs, for JPEGs (libjpeg region decoding).

Backed by the optional C extension ``shardkit.codec._jpeg_region`` (built at install when libjpeg
headers are present). Rows above the box are skipped, rows below are never decoded and columns
outside the iMCU-aligned box are not inverse-transformed, so for RandomResizedCrop the decode
cost follows the crop. Two pixels of chroma-upsampling context are decoded beside the box, so
the output equals the same box of a full decode by the same libjpeg, pixel for pixel (tested). A
CMYK JPEG's box is converted to RGB as PIL converts the whole image; its full decode is PIL's,
whose libjpeg may be another build (equal on the tests' and the ImageNet-like set's files).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image

from shardkit.codec import jpeg_restart
from shardkit.transforms.params import CropFlip

_decode_crop: Callable[[bytes | memoryview, int, int, int, int], bytearray] | None = None
try:
    from shardkit.codec import _jpeg_region  # type: ignore[attr-defined]

    _decode_crop = _jpeg_region.decode_crop
except ImportError:  # extension not built (no libjpeg headers at install): full decodes only
    pass


def within_pixel_limit(height: int, width: int) -> bool:
    """Whether an image of this size is under PIL's decompression-bomb limit (where PIL raises)."""
    limit = Image.MAX_IMAGE_PIXELS
    return limit is None or height * width <= 2 * limit


def roi_available() -> bool:
    """Whether region decoding is available in this installation."""
    return _decode_crop is not None


def decode_box_rgb(data: bytes | memoryview, box: CropFlip) -> torch.Tensor | None:
    """The pixels of ``box`` as uint8 ``[3, box.height, box.width]`` (HWC memory), or ``None``
    when this image needs a full decode instead (not a baseline/progressive YCbCr, gray, RGB or
    CMYK JPEG, e.g. YCCK; any libjpeg warning or error; or no extension). A CMYK JPEG's box is
    converted to RGB as PIL's ``convert("RGB")`` converts it. Never raises for bad data: the full
    decode that follows decides whether the image is corrupt.

    Restart-indexed JPEGs (``pack --jpeg-restart``) are first cut down to the restart intervals
    around the box (:func:`shardkit.codec.jpeg_restart.cut`), so nothing outside it is
    entropy-decoded either.

    Example::

        region = decode_box_rgb(raw, params)
        image = region if region is not None else decode_rgb(raw)
    """
    if _decode_crop is None:
        return None
    top, left = box.top, box.left
    piece = jpeg_restart.cut(data, top, left, box.height, box.width)
    if piece is not None:
        data, top, left = piece.data, top - piece.top, left - piece.left
    try:
        rgb = _decode_crop(data, top, left, box.height, box.width)
    except ValueError:
        return None
    return torch.frombuffer(rgb, dtype=torch.uint8).view(box.height, box.width, 3).permute(2, 0, 1)
