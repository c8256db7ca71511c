"""CPU tensor ops on single uint8 images: crop, antialiased bilinear (or bicubic) resize, flip."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from shardkit.transforms.params import CropFlip

hwc_to_chw: Callable[[np.ndarray, np.ndarray, int, int, bool], None] | None = None
with contextlib.suppress(ImportError):  # extension not built (no C compiler at install): numpy repacks instead
    hwc_to_chw = importlib.import_module("shardkit.transforms._planar").hwc_to_chw

__all__ = ["INTERPOLATIONS", "crop_resize_flip", "resize_uint8"]

#: The resize filters a transform may ask for: torchvision's default (bilinear) and the one most of
#: timm's pretrained configurations name (bicubic); both antialiased, as torchvision's ``antialias=True``.
INTERPOLATIONS = ("bilinear", "bicubic")


def resize_uint8(crop: torch.Tensor, size: tuple[int, int], interpolation: str = "bilinear") -> torch.Tensor:
    """Antialiased bilinear (or bicubic) resize of a uint8 ``[3, h, w]`` tensor, equal to v2 ``resize``.

    The result's memory is HWC when the input's is (see the comment below); example:
    ``resize_uint8(img, (224, 224))``.
    """
    # torch's uint8 antialiased bilinear kernel (AVX2/AVX512) works in HWC. Feeding it a
    # channels-last-contiguous input makes it write a channels-last output directly; a CHW
    # output costs an extra repack (~40% more time at 224x224, docs/performance-history.md, "CPU loader").
    if crop.stride(0) == 1 and crop.stride(2) == 3:  # HWC memory: what decode_rgb returns
        x = crop.permute(1, 2, 0).contiguous().unsqueeze(0).permute(0, 3, 1, 2)  # cheap row copy
    else:
        x = crop.unsqueeze(0)
    return F.interpolate(x, size=size, mode=interpolation, antialias=True, align_corners=False)[0]


def _write(out: torch.Tensor, res: torch.Tensor, flip: bool) -> torch.Tensor:
    # HWC -> CHW memory (and the flip): the C repacker when built (~15 us at 224x224), else
    # numpy (~90 us; torch's copy_ takes 180-280 us). Into HWC memory torch is the fast one
    # (numpy's flip there goes element by element).
    cpu = out.device.type == "cpu" and res.device.type == "cpu"
    if (hwc_to_chw is not None and cpu and out.is_contiguous() and res.stride(0) == 1
            and res.stride(2) == 3 and res.stride(1) == 3 * res.shape[2]):
        hwc_to_chw(res.permute(1, 2, 0).numpy(), out.numpy(), res.shape[1], res.shape[2], flip)
        return out
    if out.stride(0) != 1 and cpu:
        src = res.numpy()
        np.copyto(out.numpy(), src[:, :, ::-1] if flip else src)
        return out
    return out.copy_(res.flip(-1) if flip else res)


def crop_resize_flip(
    image: torch.Tensor,
    params: CropFlip,
    size: tuple[int, int],
    out: torch.Tensor | None = None,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """Crop ``params``' box out of ``image``, resize it to ``size``, then flip if asked.

    Resizing is antialiased bilinear (or ``interpolation="bicubic"``) on uint8 (torchvision v2
    ``resized_crop`` semantics, equal values), so the cost follows the box and output size, not
    the image size.

    Args:
        image: uint8 ``[3, H, W]``, any strides (HWC memory is fastest).
        params: the box (must lie inside the image) and flip flag.
        size: ``(height, width)`` of the output.
        out: optional uint8 ``[3, *size]`` tensor (e.g. a slice of a pinned batch buffer,
            channels-last is fastest) to write into; returned.
    Returns:
        uint8 ``[3, *size]``; without ``out`` its memory is HWC when the input's is.
    Raises:
        ValueError: wrong dtype/shape, or a box outside the image.
    Example:
        >>> import torch
        >>> from shardkit.transforms import CropFlip, crop_resize_flip
        >>> img = torch.zeros(3, 300, 400, dtype=torch.uint8)
        >>> crop_resize_flip(img, CropFlip(0, 50, 300, 300, flip=True), (224, 224)).shape
        torch.Size([3, 224, 224])
    """
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"expected a uint8 [3, H, W] image, got {image.dtype} {list(image.shape)}")
    height, width = image.shape[1], image.shape[2]
    if not params.inside(height, width):
        raise ValueError(f"crop {params} does not lie inside a {height}x{width} image")
    if out is not None and (out.dtype != torch.uint8 or tuple(out.shape) != (3, *size)):
        raise ValueError(
            f"out must be uint8 [3, {size[0]}, {size[1]}], got {out.dtype} {list(out.shape)}"
        )
    t, lft = params.top, params.left
    res = image[:, t : t + params.height, lft : lft + params.width]
    fresh = False  # whether res is a new tensor rather than a view of image
    if (params.height, params.width) != tuple(size):
        res, fresh = resize_uint8(res, size, interpolation), True
    if out is not None:
        return _write(out, res, params.flip)
    if params.flip:
        res, fresh = res.flip(-1), True
    if fresh:
        return res
    if res.stride(0) == 1:  # keep HWC memory (a plain clone would repack to CHW)
        return res.permute(1, 2, 0).contiguous().permute(2, 0, 1)
    return res.contiguous()
