"""The filter loop both Triton resize kernels share, as one ``@triton.jit`` helper.

:mod:`~shardkit.transforms.gpu_kernel` (one output size per batch) and
:mod:`~shardkit.transforms.gpu_ragged_kernel` (an output size per image) differ in where a pixel's
centre and its output place come from; the taps, weights, three channel planes and the rounding
are this one loop, so both give the same pixels for the same geometry row. The math is
:func:`shardkit.transforms.gpu._eager_resize`'s (an antialiased triangle filter, as torchvision's
``antialias=True`` bilinear), in float32. Only the kernels' builders import this module (Triton is optional).
"""

from __future__ import annotations

from typing import Any

__all__ = ["filter_taps"]

# Imported only by the kernels' builders (and the doctest run): Triton is optional. Where it is
# missing, filter_taps is None and the eager path runs instead.
try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton ships with CUDA builds of torch
    triton = None


#: The jitted helper: ``(v0, v1, v2) = filter_taps(flat, base, width, plane, top, left, box_h,
#: box_w, cy, cx, scale_y, scale_x, mask, BLOCK)`` gives a block of output pixels' three channels,
#: rounded and clamped to [0, 255] (float32), from the crop box at ``top, left`` of size
#: ``box_h x box_w`` in the planes at ``flat + base`` (row ``width``, plane stride ``plane``),
#: each pixel centred at ``cy, cx`` in box coordinates.
filter_taps: Any = None

if triton is not None:
    @triton.jit
    def filter_taps(flat, base, width, plane, top, left, box_h, box_w, cy, cx, scale_y, scale_x, inside,
                    BLOCK: tl.constexpr):
        sup_y = tl.maximum(scale_y, 1.0)
        sup_x = tl.maximum(scale_x, 1.0)
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
        v0 = tl.minimum(tl.maximum(tl.floor(acc0 / wsum + 0.5), 0.0), 255.0)
        v1 = tl.minimum(tl.maximum(tl.floor(acc1 / wsum + 0.5), 0.0), 255.0)
        v2 = tl.minimum(tl.maximum(tl.floor(acc2 / wsum + 0.5), 0.0), 255.0)
        return v0, v1, v2
