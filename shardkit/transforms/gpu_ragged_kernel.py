"""The Triton kernel behind :func:`~shardkit.transforms.gpu_ragged.crop_resize_flip_ragged`.

:mod:`shardkit.transforms.gpu_kernel`'s kernel with the output size read per sample (its
geometry row's ``virt_h, virt_w``) instead of compiled in, and each image written at its own
place (start, plane and row stride). One program per (sample, block of output pixels) over the
batch's largest output; blocks past a smaller image's pixels are masked. Same float32 math, same
taps, so both kernels give the same pixels for the same row. :func:`warm_up` compiles it ahead
(:mod:`shardkit.transforms.gpu_ahead`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from shardkit.transforms import gpu_ahead

__all__ = ["launch", "warm_up"]

BLOCK = 256
_taps: Any = None  # the shared filter loop, set when the kernel is built


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    from shardkit.transforms.gpu_filter import filter_taps

    global _taps
    _taps = filter_taps  # a global of this module: Triton resolves a kernel's callees there

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
        cy = scale_y * (i.to(tl.float32) + 0.5)
        cx = scale_x * (src_j.to(tl.float32) + 0.5)
        v0, v1, v2 = _taps(flat, base, width, plane, top, left, box_h, box_w, cy, cx, scale_y, scale_x, inside,
                          BLOCK)
        dst = out + start + i.to(tl.int64) * out_row + j
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
    gpu_ahead.wait(("ragged", out.device.index))
    grid = (n, (largest + BLOCK - 1) // BLOCK)
    _kernel()[grid](flat, offsets, geom, places, out, NCOL=geom.shape[1], BLOCK=BLOCK)


def warm_up(device: torch.device) -> None:
    """Compile the kernel on CUDA ``device`` in a thread, once per process and device
    (:func:`shardkit.transforms.gpu_ahead.ahead`); nothing where Triton is missing. Its output
    sizes are read per row, so one compile serves every size."""
    from shardkit.transforms.gpu_kernel import available

    if device.type != "cuda" or not available():
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    gpu_ahead.ahead(("ragged", index), functools.partial(_compile, index))


def _compile(index: int) -> None:
    from shardkit.transforms.gpu_kernel import warm_launch

    def run(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor) -> None:
        places = torch.tensor([[0, 4, 2]], dtype=torch.int64, device=flat.device)  # start, plane, row
        launch(flat, offsets, geom, torch.empty(12, dtype=torch.uint8, device=flat.device), places, 4)

    warm_launch(index, (2, 2), run)
