"""Batched JPEG decoding on a CUDA device (nvJPEG through torchvision), and which files it takes.

Workers call :func:`nvjpeg_friendly` on each sample's bytes: only baseline/extended Huffman JPEGs
with three components (YCbCr) go to the GPU; CMYK/YCCK, grayscale, progressive, lossless and
arithmetic-coded JPEGs, and every other format, are decoded on the CPU (``decode.decode_rgb``)
so the batch has the same shape, dtype and meaning whichever path an image took.

Example:
    >>> nvjpeg_friendly(b"PNG...")
    False
"""

from __future__ import annotations

import functools
import io
import logging
import warnings

import torch

from shardkit.codec.decode import Bytes, is_jpeg
from shardkit.codec.jpeg_header import SEQUENTIAL_HUFFMAN, jpeg_frame

__all__ = ["GpuJpegDecoder", "gpu_decode_unavailable", "nvjpeg_friendly"]

log = logging.getLogger(__name__)


def nvjpeg_friendly(data: Bytes) -> bool:
    """True for a sequential Huffman JPEG with three components (what the GPU path decodes)."""
    mv = memoryview(data).cast("B")
    if not is_jpeg(mv):
        return False
    frame = jpeg_frame(mv)
    return frame is not None and frame.marker in SEQUENTIAL_HUFFMAN and frame.components == 3


def _decode_jpeg(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():  # torchvision.io decoding is deprecated in favour of TorchCodec
        warnings.simplefilter("ignore")
        out = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    return list(out)


@functools.cache
def gpu_decode_unavailable(device: torch.device) -> str | None:
    """None when batched nvJPEG decoding works on ``device``, else why not (probed once)."""
    if device.type != "cuda":
        return f"device {device} is not a CUDA device"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    try:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 8), (200, 40, 90)).save(buf, "JPEG", quality=90)
        probe = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        got = _decode_jpeg([probe, probe], device)
        if len(got) != 2 or tuple(got[0].shape) != (3, 8, 16) or got[0].device.type != "cuda":
            return f"nvJPEG probe returned {[tuple(g.shape) for g in got]}"
    except Exception as e:  # torchvision without CUDA image ops, no nvJPEG, driver trouble
        return f"nvJPEG decode failed: {type(e).__name__}: {e}"
    return None


class GpuJpegDecoder:
    """Decode lists of JPEG byte tensors on ``device`` in one batched nvJPEG call.

    ``decode`` runs on the caller's current CUDA stream; results are uint8 ``[3, H, W]``
    CHW-contiguous CUDA tensors. Raises ``RuntimeError`` from torchvision when an image in the
    list cannot be decoded (callers fall back per image).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def decode(self, datas: list[torch.Tensor]) -> list[torch.Tensor]:
        if not datas:
            return []
        return _decode_jpeg(datas, self.device)
