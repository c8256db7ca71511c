"""The Triton kernel behind :func:`~shardkit.transforms.gpu_ragged.crop_resize_flip_ragged`.

:mod:`shardkit.transforms.gpu_kernel`'s kernel with the output size read per sample (its
geometry row's ``virt_h, virt_w``) instead of compiled in, and each image written at its own
place (start, plane and row stride). One program per (sample, block of output pixels) over the
batch's largest output; blocks past a smaller image's pixels are masked. Same float32 math, same
taps, so both kernels give the same pixels for the same row.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["launch"]

BLOCK = 256


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def crop_resize_flip_ragged(flat, offsets, geom, places, out, NCOL: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        g = geom + b * NCOL
        width = tl.load(g + 1)
        plane = tl.load(g + 0).to(tl.int64) * width
        top, left = tl.load(g + 2), tl.load(g + 3)
        box_h, box_w = tl.load(g + 4), tl.load(g + 5)
        oh, ow = tl.load(g + 6), tl.load(g + 7)
        scale_y = box_h.to(tl.float32) / oh.to(tl.float32)
        scale_x = box_w.to(tl.float32) / ow.to(tl.float32)
        flip, dest = tl.load(g + 10), tl.load(g + 11)
        base = tl.load(offsets + b)
        place = places + dest.to(tl.int64) * 3
        start, out_plane, out_row = tl.load(place), tl.load(place + 1), tl.load(place + 2)
        p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = p < oh * ow
        i = p // ow
        j = p % ow
        src_j = tl.where(flip != 0, ow - 1 - j, j)
        sup_y = tl.maximum(scale_y, 1.0)
        sup_x = tl.maximum(scale_x, 1.0)
        cy = scale_y * (i.to(tl.float32) + 0.5)
        cx = scale_x * (src_j.to(tl.float32) + 0.5)
        ylo = tl.maximum((cy - sup_y + 0.5).to(tl.int32), 0)
        yhi = tl.minimum((cy + sup_y + 0.5).to(tl.int32), box_h)
        xlo = tl.maximum((cx - sup_x + 0.5).to(tl.int32), 0)
        xhi = tl.minimum((cx + sup_x + 0.5).to(tl.int32), box_w)
        taps_y = (2.0 * sup_y).to(tl.int32) + 2
        taps_x = (2.0 * sup_x).to(tl.int32) + 2
        acc0 = tl.zeros([BLOCK], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK], dtype=tl.float32)
        wsum = tl.zeros([BLOCK], dtype=tl.float32)
        for ky in range(0, taps_y):
            y = ylo + ky
            wy = tl.maximum(1.0 - tl.abs((y.to(tl.float32) - cy + 0.5) / sup_y), 0.0)
            wy = tl.where(y < yhi, wy, 0.0)
            row = base + (top + tl.minimum(y, box_h - 1)).to(tl.int64) * width + left
            for kx in range(0, taps_x):
                x = xlo + kx
                wx = tl.maximum(1.0 - tl.abs((x.to(tl.float32) - cx + 0.5) / sup_x), 0.0)
                w = wy * tl.where(x < xhi, wx, 0.0)
                ptr = flat + row + tl.minimum(x, box_w - 1)
                m = inside & (w > 0)
                acc0 += w * tl.load(ptr, mask=m, other=0).to(tl.float32)
                acc1 += w * tl.load(ptr + plane, mask=m, other=0).to(tl.float32)
                acc2 += w * tl.load(ptr + 2 * plane, mask=m, other=0).to(tl.float32)
                wsum += w
        wsum = tl.maximum(wsum, 1e-12)
        dst = out + start + i.to(tl.int64) * out_row + j
        v0 = tl.minimum(tl.maximum(tl.floor(acc0 / wsum + 0.5), 0.0), 255.0)
        v1 = tl.minimum(tl.maximum(tl.floor(acc1 / wsum + 0.5), 0.0), 255.0)
        v2 = tl.minimum(tl.maximum(tl.floor(acc2 / wsum + 0.5), 0.0), 255.0)
        tl.store(dst, v0.to(tl.uint8), mask=inside)
        tl.store(dst + out_plane, v1.to(tl.uint8), mask=inside)
        tl.store(dst + 2 * out_plane, v2.to(tl.uint8), mask=inside)

    return crop_resize_flip_ragged


def launch(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor, out: torch.Tensor,
           places: torch.Tensor, largest: int) -> None:
    """Run the kernel on the current stream (arguments already checked by the caller);
    ``largest``: the most output pixels of one image (the grid covers it)."""
    n = geom.shape[0]
    if n == 0:
        return
    grid = (n, (largest + BLOCK - 1) // BLOCK)
    _kernel()[grid](flat, offsets, geom, places, out, NCOL=geom.shape[1], BLOCK=BLOCK)
