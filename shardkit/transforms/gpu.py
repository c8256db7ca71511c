"""Batched crop-resize-flip over images of different sizes, in one launch per batch.

Images lie in one flat uint8 buffer (each image CHW-contiguous at its own offset, as nvJPEG
returns them). Each sample has a row of integer *geometry* (see :data:`GEOMETRY_COLUMNS`):

* ``height, width``: the decoded image;
* ``top, left, box_h, box_w``: the source box; taps never read outside it (edge weights are
  renormalised, exactly like torch's antialiased resize of that box);
* ``virt_h, virt_w, off_y, off_x``: the box is resized to ``virt_h x virt_w`` and the output is
  the ``out_h x out_w`` window at ``(off_y, off_x)`` of that resize. RandomResizedCrop uses the
  crop as box, ``virt = out`` and offset 0; the ImageNet eval transform uses the whole image as
  box, the shorter-side resize as ``virt`` and the centre-crop offset, so both match the CPU path;
* ``flip``: mirror the output horizontally; ``dest``: the output row to write.

Resampling is torch's antialiased bilinear (``F.interpolate(..., antialias=True)``: triangle
filter widened by the scale when downsampling), computed in float32 and rounded to uint8 once.
torch's CPU uint8 kernel rounds after each separable pass, so values differ from it by at most
a level or two (tested).

Two implementations agree: :func:`_eager_resize` (plain torch ops over the whole batch, any
device; the reference, used with ``compile=False`` and where Triton is missing) and the Triton
kernel in :mod:`shardkit.transforms.gpu_kernel` (one launch).

Example:
    >>> img = torch.arange(3 * 6 * 8, dtype=torch.uint8).reshape(3, 6, 8)
    >>> geom = geometry_rows([(6, 8)], [CropFlip(0, 0, 6, 8)], (3, 4))
    >>> crop_resize_flip_batch(img.reshape(-1), torch.tensor([0]), geom, (3, 4), compile=False).shape
    torch.Size([1, 3, 3, 4])
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from shardkit.transforms.params import CropFlip

__all__ = ["GEOMETRY_COLUMNS", "crop_resize_flip_batch", "geometry_rows", "gpu_window", "window_geometry"]

GEOMETRY_COLUMNS = ("height", "width", "top", "left", "box_h", "box_w", "virt_h", "virt_w",
                    "off_y", "off_x", "flip", "dest")  # fmt: skip
Window = tuple[int, int, int, int, int, int, int, int, int, int, int]
_NO_RNG = random.Random(0)  # centre crops draw nothing


def window_geometry(height: int, width: int, params: CropFlip, size: tuple[int, int]) -> Window:
    """Geometry (without ``dest``) that resizes ``params``' box to ``size`` and flips."""
    return (height, width, params.top, params.left, params.height, params.width,
            size[0], size[1], 0, 0, int(params.flip))  # fmt: skip


def geometry_rows(sizes: Sequence[tuple[int, int]], params: Sequence[CropFlip],
                  size: tuple[int, int], dests: Sequence[int] | None = None) -> torch.Tensor:
    """int32 ``[n, 12]`` geometry for plain crop-resize-flip windows (``dest`` defaults to ``i``)."""
    rows = [(*window_geometry(h, w, p, size), i if dests is None else dests[i])
            for i, ((h, w), p) in enumerate(zip(sizes, params, strict=True))]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, len(GEOMETRY_COLUMNS))


def _check(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor, out: torch.Tensor) -> None:
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"flat must be a 1-D uint8 tensor, got {flat.dtype} {list(flat.shape)}")
    if geom.dtype != torch.int32 or geom.dim() != 2 or geom.shape[1] != len(GEOMETRY_COLUMNS):
        raise ValueError(f"geom must be int32 [n, {len(GEOMETRY_COLUMNS)}], got {geom.dtype} {list(geom.shape)}")
    if offsets.shape != (geom.shape[0],):
        raise ValueError(f"need one offset per geometry row, got {list(offsets.shape)} for {geom.shape[0]}")
    if out.dtype != torch.uint8 or out.dim() != 4 or out.shape[1] != 3 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous uint8 [B, 3, H, W], got {out.dtype} {list(out.shape)}")
    if not (flat.device == offsets.device == geom.device == out.device):
        raise ValueError("flat, offsets, geom and out must be on one device")


def _axis(size: torch.Tensor, virt: torch.Tensor, off: torch.Tensor, n_out: int, taps: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample and output index: first source tap ``[B, n]`` and normalised weights ``[B, n, taps]``."""
    size_f, virt_f = size.double()[:, None], virt.double()[:, None]
    scale = size_f / virt_f
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    inv = 1.0 / support
    idx = torch.arange(n_out, device=size.device, dtype=torch.float64)[None, :] + off.double()[:, None]
    center = scale * (idx + 0.5)
    lo = torch.clamp((center - support + 0.5).trunc(), min=0)
    hi = torch.minimum((center + support + 0.5).trunc(), size_f)
    k = torch.arange(taps, device=size.device, dtype=torch.float64)
    src = lo[..., None] + k
    w = torch.clamp(1 - ((src - center[..., None] + 0.5) * inv[..., None]).abs(), min=0)
    w = torch.where(src < hi[..., None], w, torch.zeros_like(w))
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
    return lo.long(), w.float()


def max_taps(geom: torch.Tensor) -> tuple[int, int]:
    """Upper bound on filter taps per axis over a batch: ``ceil(2 * support) + 1``."""
    g = geom.detach().to("cpu", torch.int64)
    sy = torch.clamp(g[:, 4].double() / g[:, 6].double(), min=1).max().item() if len(g) else 1.0
    sx = torch.clamp(g[:, 5].double() / g[:, 7].double(), min=1).max().item() if len(g) else 1.0
    return math.ceil(2 * sy) + 2, math.ceil(2 * sx) + 2


def _eager_resize(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor, out: torch.Tensor) -> None:
    """Reference: the same math as the kernel with whole-batch torch ops (loops over taps only)."""
    n, (oh, ow) = geom.shape[0], out.shape[-2:]
    if n == 0:
        return
    taps_y, taps_x = max_taps(geom)
    g = geom.long()
    height, width, top, left = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
    y0, wy = _axis(g[:, 4], g[:, 6], g[:, 8], oh, taps_y)  # [B, oh], [B, oh, ty]
    x0, wx = _axis(g[:, 5], g[:, 7], g[:, 9], ow, taps_x)
    flip = g[:, 10].bool()
    x0 = torch.where(flip[:, None], x0.flip(-1), x0)  # output column j reads resized column ow-1-j
    wx = torch.where(flip[:, None, None], wx.flip(1), wx)
    plane = (height * width)[:, None, None]
    acc = torch.zeros((n, 3, oh, ow), dtype=torch.float32, device=out.device)
    for ky in range(taps_y):
        row = torch.minimum(y0 + ky, g[:, 4:5] - 1) + top[:, None]  # clamped; weight is 0 there
        for kx in range(taps_x):
            col = torch.minimum(x0 + kx, g[:, 5:6] - 1) + left[:, None]
            idx = offsets[:, None, None] + row[:, :, None] * width[:, None, None] + col[:, None, :]
            weight = wy[:, :, None, ky] * wx[:, None, :, kx]
            for c in range(3):
                acc[:, c] += weight * flat[idx + c * plane].float()
    out[g[:, 11]] = torch.floor(acc + 0.5).clamp_(0, 255).to(torch.uint8)


def crop_resize_flip_batch(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor,
                           size: tuple[int, int], *, out: torch.Tensor | None = None,
                           compile: bool = True) -> torch.Tensor:
    """Crop, antialiased-bilinear resize and flip every sample of a batch in one go.

    Args:
        flat: uint8 1-D buffer holding each image CHW-contiguous.
        offsets: int64 ``[n]``, where each image starts in ``flat``.
        geom: int32 ``[n, 12]`` rows of :data:`GEOMETRY_COLUMNS` (on ``flat``'s device).
        size: ``(out_h, out_w)``.
        out: optional contiguous uint8 ``[B, 3, out_h, out_w]``; rows not named by ``dest`` are
            left untouched (e.g. images decoded on the CPU).
        compile: True: the Triton kernel (one launch) on CUDA when Triton imports; False or no
            Triton: the eager reference.
    Returns:
        ``out`` (or a new ``[n, 3, *size]`` tensor).
    Raises:
        ValueError: wrong dtypes, shapes or devices.
    """
    if out is None:
        out = torch.empty((geom.shape[0], 3, *size), dtype=torch.uint8, device=flat.device)
    _check(flat, offsets, geom, out)
    if tuple(out.shape[-2:]) != tuple(size):
        raise ValueError(f"out is {list(out.shape)}, size is {size}")
    if compile and flat.is_cuda:
        from shardkit.transforms import gpu_kernel

        if gpu_kernel.available():
            gpu_kernel.launch(flat, offsets, geom, out)
            return out
    _eager_resize(flat, offsets, geom, out)
    return out


def gpu_window(transform: object, height: int, width: int, params: CropFlip,
               size: tuple[int, int]) -> Window:
    """The geometry (without ``dest``) that reproduces ``transform.apply(image, params)``.

    For :class:`~shardkit.transforms.ResizeCenterCrop` given its own centre box, that is the
    resize of the whole image cropped at the centre offset (what its CPU ``apply`` computes);
    for everything else the box resized to ``size`` and flipped.
    """
    from shardkit.transforms.center_crop import ResizeCenterCrop, _resized_size

    if isinstance(transform, ResizeCenterCrop) and params == transform.sample_params(height, width, _NO_RNG):
        new_h, new_w = _resized_size(height, width, transform.resize_to)
        top, left = int(round((new_h - size[0]) / 2.0)), int(round((new_w - size[1]) / 2.0))
        return (height, width, 0, 0, height, width, new_h, new_w, top, left, 0)
    return window_geometry(height, width, params, size)
