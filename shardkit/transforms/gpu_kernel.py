"""The Triton kernel behind :func:`~shardkit.transforms.gpu.crop_resize_flip_batch`.

One program per (sample, block of output pixels); each output pixel loops over its filter taps
(dynamic bounds from the sample's scale) and reads all three channel planes, so the whole batch,
whatever its image sizes, is one launch. The math is
:func:`shardkit.transforms.gpu._eager_resize`'s, in float32. Triton is imported lazily:
``available()`` is False where it is missing. :func:`warm_up` compiles it ahead for an output
size (:mod:`shardkit.transforms.gpu_ahead`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from shardkit.transforms import gpu_ahead
from shardkit.transforms.gpu import GEOMETRY_COLUMNS

__all__ = ["available", "launch", "tiny_batch", "warm_launch", "warm_up"]

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
    def crop_resize_flip(flat, offsets, geom, out, OH: tl.constexpr, OW: tl.constexpr,
                         NCOL: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        g = geom + b * NCOL
        width = tl.load(g + 1)
        plane = tl.load(g + 0).to(tl.int64) * width
        top, left = tl.load(g + 2), tl.load(g + 3)
        box_h, box_w = tl.load(g + 4), tl.load(g + 5)
        scale_y = box_h.to(tl.float32) / tl.load(g + 6).to(tl.float32)
        scale_x = box_w.to(tl.float32) / tl.load(g + 7).to(tl.float32)
        off_y, off_x, flip, dest = tl.load(g + 8), tl.load(g + 9), tl.load(g + 10), tl.load(g + 11)
        base = tl.load(offsets + b)
        p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = p < OH * OW
        i = p // OW
        j = p % OW
        j = tl.where(flip != 0, OW - 1 - j, j)
        cy = scale_y * ((off_y + i).to(tl.float32) + 0.5)
        cx = scale_x * ((off_x + j).to(tl.float32) + 0.5)
        v0, v1, v2 = _taps(flat, base, width, plane, top, left, box_h, box_w, cy, cx, scale_y, scale_x, inside,
                          BLOCK)
        dst = out + dest.to(tl.int64) * (3 * OH * OW) + p
        tl.store(dst, v0.to(tl.uint8), mask=inside)
        tl.store(dst + OH * OW, v1.to(tl.uint8), mask=inside)
        tl.store(dst + 2 * OH * OW, v2.to(tl.uint8), mask=inside)

    return crop_resize_flip


@functools.cache
def available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    try:
        import triton  # noqa: F401
    except Exception:  # missing or broken install: the eager path is used instead
        return False
    return torch.cuda.is_available()


def launch(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor,
           out: torch.Tensor) -> None:
    """Run the kernel on the current stream (arguments already checked by the caller); wait
    first for a :func:`warm_up` of this output size still compiling."""
    n = geom.shape[0]
    if n == 0:
        return
    oh, ow = int(out.shape[-2]), int(out.shape[-1])
    gpu_ahead.wait(("resize", out.device.index, oh, ow))
    grid = (n, (oh * ow + BLOCK - 1) // BLOCK)
    _kernel()[grid](flat, offsets, geom, out, OH=oh, OW=ow, NCOL=geom.shape[1], BLOCK=BLOCK)


def warm_up(size: tuple[int, int], device: torch.device) -> None:
    """Compile the kernel for output ``size`` on CUDA ``device`` in a thread, once per process,
    device and size (:func:`shardkit.transforms.gpu_ahead.ahead`); nothing where Triton is missing."""
    if device.type != "cuda" or not available():
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    gpu_ahead.ahead(("resize", index, *size), functools.partial(_compile, size, index))


def _compile(size: tuple[int, int], index: int) -> None:
    warm_launch(index, size, lambda flat, offsets, geom: launch(
        flat, offsets, geom, torch.empty((1, 3, *size), dtype=torch.uint8, device=flat.device)))


def warm_launch(index: int, size: tuple[int, int],
                run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> None:
    """``run(flat, offsets, geom)`` for a 2x2 image resized to ``size`` on CUDA device ``index``,
    on a stream of its own, then wait for it: a kernel's compile, by a launch of next to nothing."""
    with torch.cuda.device(index):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            run(*tiny_batch(torch.device("cuda", index), size))
        stream.synchronize()


def tiny_batch(device: torch.device, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(flat, offsets, geom)`` of one 2x2 image resized whole to ``size``, on ``device``.

    Example:
        >>> [t.tolist() for t in tiny_batch(torch.device("cpu"), (3, 3))[1:]]
        [[0], [[2, 2, 0, 0, 2, 2, 3, 3, 0, 0, 0, 0]]]
    """
    flat = torch.arange(12, dtype=torch.uint8, device=device)  # channel planes of 4 pixels
    offsets = torch.zeros(1, dtype=torch.int64, device=device)
    geom = torch.zeros((1, len(GEOMETRY_COLUMNS)), dtype=torch.int32, device=device)
    geom[0, :8] = torch.tensor([2, 2, 0, 0, 2, 2, *size])  # height, width, box, output size
    return flat, offsets, geom
