"""Batched crop-resize-flip to a different output size per image (detection), in one launch.

:func:`~shardkit.transforms.gpu.crop_resize_flip_batch` writes every image at one output size;
detection resizes each image to its own (shorter side 800, longer at most 1333: 800x1066 for a
4:3 photo, 800x1200 for 2:3). Here each geometry row (:data:`~shardkit.transforms.gpu.GEOMETRY_COLUMNS`)
resizes its box to ``virt_h x virt_w`` (offsets must be 0: the output is the whole resize) and
the ``dest`` column picks a row of ``places``, int64 ``[B, 3]``: where output image ``dest``
starts in the flat uint8 output, its plane stride and its row stride. :func:`ragged_layout`
makes the two layouts the loader delivers:

* ``pad=0``: images back to back, each CHW-contiguous (views of one buffer give the list);
* ``pad=k``: one zero-filled ``[B, 3, H, W]`` canvas, H and W the largest sides rounded up to
  ``k``, each image at its top-left corner (what ``pad_images`` builds on the CPU route).

The math is the classification kernel's (torch's antialiased bilinear in float32, rounded
once); :func:`_eager_ragged` runs the reference image by image, the Triton kernel in
:mod:`shardkit.transforms.gpu_ragged_kernel` the whole batch at once.

Example:
    >>> from shardkit.transforms.gpu import geometry_rows
    >>> from shardkit.transforms.params import CropFlip
    >>> img = torch.arange(3 * 6 * 8, dtype=torch.uint8).reshape(3, 6, 8)
    >>> geom = geometry_rows([(6, 8)], [CropFlip(0, 0, 6, 8)], (3, 4))
    >>> places, shape = ragged_layout([(3, 4)], pad=0)
    >>> out = torch.empty(shape, dtype=torch.uint8)
    >>> crop_resize_flip_ragged(img.reshape(-1), torch.tensor([0]), geom, out, places, compile=False).shape
    torch.Size([36])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardkit.transforms.gpu import GEOMETRY_COLUMNS, Col, _eager_resize

__all__ = ["crop_resize_flip_ragged", "ragged_images", "ragged_layout"]


def ragged_layout(sizes: Sequence[tuple[int, int]], pad: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``(places, shape)`` for output images of ``sizes``: ``places`` int64 ``[B, 3]`` (start,
    plane stride, row stride in the flat output), ``shape`` the output tensor's: ``(total,)``
    back to back when ``pad == 0``, else ``(B, 3, H, W)`` with H and W multiples of ``pad``.

    Example:
        >>> ragged_layout([(2, 3), (1, 2)], pad=0)[0].tolist(), ragged_layout([(2, 3), (1, 2)], pad=0)[1]
        ([[0, 6, 3], [18, 2, 2]], (24,))
        >>> ragged_layout([(2, 3), (1, 2)], pad=4)
        (tensor([[ 0, 16,  4],
                [48, 16,  4]]), (2, 3, 4, 4))
    """
    if pad < 0:
        raise ValueError(f"pad must be >= 0, got {pad}")
    n = len(sizes)
    if pad:
        h, w = ((-(-max(s[k] for s in sizes) // pad) * pad for k in (0, 1)) if n else (0, 0))
        rows = [(i * 3 * h * w, h * w, w) for i in range(n)]
        return torch.tensor(rows, dtype=torch.int64).reshape(n, 3), (n, 3, h, w)
    rows, start = [], 0
    for h, w in sizes:
        rows.append((start, h * w, w))
        start += 3 * h * w
    return torch.tensor(rows, dtype=torch.int64).reshape(n, 3), (start,)


def ragged_images(out: torch.Tensor, places: torch.Tensor, sizes: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """Views ``[3, h, w]`` of each output image (contiguous for ``pad=0``), from host-side ``places``."""
    flat = out.reshape(-1)
    return [flat.as_strided((3, h, w), (plane, row, 1), flat.storage_offset() + start)
            for (start, plane, row), (h, w) in zip(places.tolist(), sizes, strict=True)]


def _check(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor, out: torch.Tensor,
           places: torch.Tensor) -> None:
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"flat must be a 1-D uint8 tensor, got {flat.dtype} {list(flat.shape)}")
    if geom.dtype != torch.int32 or geom.dim() != 2 or geom.shape[1] != len(GEOMETRY_COLUMNS):
        raise ValueError(f"geom must be int32 [n, {len(GEOMETRY_COLUMNS)}], got {geom.dtype} {list(geom.shape)}")
    if offsets.shape != (geom.shape[0],):
        raise ValueError(f"need one offset per geometry row, got {list(offsets.shape)} for {geom.shape[0]}")
    if places.dtype != torch.int64 or places.dim() != 2 or places.shape[1] != 3:
        raise ValueError(f"places must be int64 [B, 3], got {places.dtype} {list(places.shape)}")
    if out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous uint8 tensor, got {out.dtype}")
    if not (flat.device == offsets.device == geom.device == out.device == places.device):
        raise ValueError("flat, offsets, geom, out and places must be on one device")


def _eager_ragged(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor, out: torch.Tensor,
                  places: torch.Tensor) -> None:
    """Reference: the classification reference, one image at a time, copied into its place."""
    rows, where = geom.tolist(), places.tolist()
    for i, row in enumerate(rows):
        if row[Col.OFF_Y] or row[Col.OFF_X]:
            raise ValueError(f"ragged outputs are whole resizes: offsets must be 0, got row {row}")
        size = (row[Col.VIRT_H], row[Col.VIRT_W])
        one = torch.empty((1, 3, *size), dtype=torch.uint8, device=out.device)
        single = geom[i:i + 1].clone()
        single[0, Col.DEST] = 0
        _eager_resize(flat, offsets[i:i + 1], single, one)
        ragged_images(out, torch.tensor([where[row[Col.DEST]]]), [size])[0].copy_(one[0])


def crop_resize_flip_ragged(flat: torch.Tensor, offsets: torch.Tensor, geom: torch.Tensor, out: torch.Tensor,
                            places: torch.Tensor, *, largest: int | None = None, compile: bool = True) -> torch.Tensor:
    """Crop, antialiased-bilinear resize (each row to its own ``virt`` size) and flip every image
    of a batch, writing image ``dest`` at ``places[dest]`` of ``out``.

    Args:
        flat: uint8 1-D buffer holding each decoded image CHW-contiguous.
        offsets: int64 ``[n]``, where each image starts in ``flat``.
        geom: int32 ``[n, len(GEOMETRY_COLUMNS)]``; ``virt_h, virt_w`` is the output size,
            ``off_y = off_x = 0``.
        out: contiguous uint8 output (see :func:`ragged_layout`); places not named by a
            ``dest`` are left untouched (images decoded on the CPU, padding).
        places: int64 ``[B, 3]`` from :func:`ragged_layout` (on ``out``'s device).
        largest: the most output pixels of one row, ``max(virt_h * virt_w)``, known on the host
            (None: read from ``geom``, which waits for the device when ``geom`` is on it).
        compile: True: the Triton kernel (one launch) on CUDA when Triton imports; else the
            eager reference.
    Returns:
        ``out``.
    Raises:
        ValueError: wrong dtypes, shapes or devices.
    """
    _check(flat, offsets, geom, out, places)
    if compile and flat.is_cuda:
        from shardkit.transforms import gpu_kernel, gpu_ragged_kernel

        if gpu_kernel.available():
            if largest is None:
                largest = int((geom[:, Col.VIRT_H].long() * geom[:, Col.VIRT_W].long()).max()) if len(geom) else 0
            gpu_ragged_kernel.launch(flat, offsets, geom, out, places, largest)
            return out
    _eager_ragged(flat, offsets, geom, out, places)
    return out
