"""Batched crop-resize-flip over images of different sizes, in one launch per batch.

Images lie in one flat uint8 buffer (each image CHW-contiguous at its own offset, as nvJPEG
returns them). Each sample has a row of integer *geometry* (columns :class:`Col`, names
:data:`GEOMETRY_COLUMNS`):

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
    >>> import torch
    >>> from shardkit.transforms import CropFlip
    >>> from shardkit.transforms.gpu import crop_resize_flip_batch, geometry_rows
    >>> img = torch.arange(3 * 6 * 8, dtype=torch.uint8).reshape(3, 6, 8)
    >>> geom = geometry_rows([(6, 8)], [CropFlip(0, 0, 6, 8)], (3, 4))
    >>> flat, offsets = img.reshape(-1), torch.tensor([0])
    >>> crop_resize_flip_batch(flat, offsets, geom, (3, 4), compile=False).shape
    torch.Size([1, 3, 3, 4])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import IntEnum

import torch

from shardkit._compat import flatten_dense
from shardkit.transforms.params import CropFlip

__all__ = ["GEOMETRY_COLUMNS", "Col", "Window", "crop_resize_flip_batch", "flat_images", "geometry_rows",
           "window_geometry"]



class Col(IntEnum):
    """The columns of a geometry row, in order (the Triton kernel reads them at these offsets)."""

    HEIGHT = 0
    WIDTH = 1
    TOP = 2
    LEFT = 3
    BOX_H = 4
    BOX_W = 5
    VIRT_H = 6
    VIRT_W = 7
    OFF_Y = 8
    OFF_X = 9
    FLIP = 10
    DEST = 11


#: Column names of a geometry row (``Col`` in order); ``len(GEOMETRY_COLUMNS)`` columns per row.
GEOMETRY_COLUMNS = tuple(c.name.lower() for c in Col)
#: A geometry row without its ``dest`` column: what a transform's ``gpu_window`` returns.
Window = tuple[int, int, int, int, int, int, int, int, int, int, int]


def window_geometry(height: int, width: int, params: CropFlip, size: tuple[int, int]) -> Window:
    """Geometry (without ``dest``) that resizes ``params``' box to ``size`` and flips."""
    return (height, width, params.top, params.left, params.height, params.width,
            size[0], size[1], 0, 0, int(params.flip))


def geometry_rows(sizes: Sequence[tuple[int, int]], params: Sequence[CropFlip],
                  size: tuple[int, int], dests: Sequence[int] | None = None) -> torch.Tensor:
    """int32 ``[n, len(GEOMETRY_COLUMNS)]`` geometry for plain crop-resize-flip windows
    (``dest`` defaults to ``i``)."""
    rows = [(*window_geometry(h, w, p, size), i if dests is None else dests[i])
            for i, ((h, w), p) in enumerate(zip(sizes, params, strict=True))]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, len(GEOMETRY_COLUMNS))


def _check(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor,
           out: torch.Tensor) -> None:
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"flat must be a 1-D uint8 tensor, got {flat.dtype} {list(flat.shape)}")
    if geom.dtype != torch.int32 or geom.dim() != 2 or geom.shape[1] != len(GEOMETRY_COLUMNS):
        raise ValueError(f"geom must be int32 [n, {len(GEOMETRY_COLUMNS)}], got {geom.dtype} "
                         f"{list(geom.shape)}")
    if offsets.shape != (geom.shape[0],):
        raise ValueError(f"need one offset per geometry row, got {list(offsets.shape)} for "
                         f"{geom.shape[0]}")
    if out.dtype != torch.uint8 or out.dim() != 4 or out.shape[1] != 3 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous uint8 [B, 3, H, W], got {out.dtype} "
                         f"{list(out.shape)}")
    if not (flat.device == offsets.device == geom.device == out.device):
        raise ValueError("flat, offsets, geom and out must be on one device")


def _axis(size: torch.Tensor, virt: torch.Tensor, off: torch.Tensor, n_out: int, taps: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample and output index: first source tap ``[B, n]`` and normalised weights
    ``[B, n, taps]``."""
    size_f, virt_f = size.double()[:, None], virt.double()[:, None]
    scale = size_f / virt_f
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    inv = 1.0 / support
    idx = (torch.arange(n_out, device=size.device, dtype=torch.float64)[None, :]
           + off.double()[:, None])
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
    sy = sx = 1.0
    if len(g):
        sy = torch.clamp(g[:, Col.BOX_H].double() / g[:, Col.VIRT_H].double(), min=1).max().item()
        sx = torch.clamp(g[:, Col.BOX_W].double() / g[:, Col.VIRT_W].double(), min=1).max().item()
    return math.ceil(2 * sy) + 2, math.ceil(2 * sx) + 2


def _eager_resize(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor,
                  out: torch.Tensor) -> None:
    """Reference: the same math as the kernel with whole-batch torch ops (loops over taps only)."""
    n, (oh, ow) = geom.shape[0], out.shape[-2:]
    if n == 0:
        return
    taps_y, taps_x = max_taps(geom)
    g = geom.long()
    height, width, top, left = g[:, Col.HEIGHT], g[:, Col.WIDTH], g[:, Col.TOP], g[:, Col.LEFT]
    box_h, box_w = g[:, Col.BOX_H:Col.BOX_H + 1], g[:, Col.BOX_W:Col.BOX_W + 1]
    # [B, oh], [B, oh, ty]
    y0, wy = _axis(g[:, Col.BOX_H], g[:, Col.VIRT_H], g[:, Col.OFF_Y], oh, taps_y)
    x0, wx = _axis(g[:, Col.BOX_W], g[:, Col.VIRT_W], g[:, Col.OFF_X], ow, taps_x)
    flip = g[:, Col.FLIP].bool()
    x0 = torch.where(flip[:, None], x0.flip(-1), x0)  # output column j reads resized column ow-1-j
    wx = torch.where(flip[:, None, None], wx.flip(1), wx)
    plane = (height * width)[:, None, None]
    acc = torch.zeros((n, 3, oh, ow), dtype=torch.float32, device=out.device)
    for ky in range(taps_y):
        row = torch.minimum(y0 + ky, box_h - 1) + top[:, None]  # clamped; weight is 0 there
        for kx in range(taps_x):
            col = torch.minimum(x0 + kx, box_w - 1) + left[:, None]
            idx = offsets[:, None, None] + row[:, :, None] * width[:, None, None] + col[:, None, :]
            weight = wy[:, :, None, ky] * wx[:, None, :, kx]
            for c in range(3):
                acc[:, c] += weight * flat[idx + c * plane].float()
    out[g[:, Col.DEST]] = torch.floor(acc + 0.5).clamp_(0, 255).to(torch.uint8)


def flat_images(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contiguous images (any shapes) laid end to end in one flat buffer, the layout
    :func:`crop_resize_flip_batch` reads (offsets: :func:`~shardkit.loader.routes.device.pinned.chw_offsets`).
    One C++ call rather than a reshape per image: on the GPU route this runs beside the training
    loop, which waits for the GIL while Python loops here.

    Example:
        >>> flat_images([torch.arange(4).view(1, 2, 2), torch.arange(2).view(1, 1, 2)]).tolist()
        [0, 1, 2, 3, 0, 1]
    """
    return flatten_dense(images)


def crop_resize_flip_batch(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor,
                           size: tuple[int, int], *, out: torch.Tensor | None = None,
                           compile: bool = True) -> torch.Tensor:
    """Crop, antialiased-bilinear resize and flip every sample of a batch in one go.

    Args:
        flat: uint8 1-D buffer holding each image CHW-contiguous.
        offsets: int64 ``[n]``, where each image starts in ``flat``.
        geom: int32 ``[n, len(GEOMETRY_COLUMNS)]`` rows of :data:`GEOMETRY_COLUMNS` (on
            ``flat``'s device).
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
