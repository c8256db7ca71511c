"""Batched JPEG decoding on a CUDA device (nvJPEG through torchvision or TorchCodec, chosen in
:mod:`shardkit.codec.backend`), and which files it takes.

Workers call :func:`nvjpeg_friendly` on each sample's bytes: only baseline/extended Huffman JPEGs
with three components (YCbCr), and with ``gray=True`` one (grayscale, sampled 1x1), go to the GPU; CMYK/YCCK,
progressive, lossless and arithmetic-coded JPEGs, and every other format, are decoded on the CPU
(``decode.decode_rgb``) so the batch has the same shape, dtype and meaning whichever path an
image took. Grayscale goes to the GPU only where :func:`gpu_decodes_gray` found that the device's
decoder turns a grayscale JPEG into the three equal channels PIL's ``convert("RGB")`` gives, as
the CPU route's images are.

Example:
    >>> nvjpeg_friendly(b"PNG...")
    False
"""

from __future__ import annotations

import logging

import torch

from shardkit.codec.backend import cpu_batch_decoder, gpu_decoder, gpu_gray
from shardkit.codec.decode import Bytes, is_jpeg
from shardkit.codec.jpeg_header import SEQUENTIAL_HUFFMAN, JpegFrame, jpeg_frame

__all__ = ["GpuJpegDecoder", "gpu_decode_unavailable", "gpu_decodes_gray", "nvjpeg_frame", "nvjpeg_friendly"]

log = logging.getLogger(__name__)


def nvjpeg_friendly(data: Bytes, *, gray: bool = False) -> bool:
    """True for a sequential Huffman JPEG with three components, or one with ``gray`` (what the
    GPU path decodes)."""
    return nvjpeg_frame(data, gray=gray) is not None


def nvjpeg_frame(data: Bytes, *, gray: bool = False) -> JpegFrame | None:
    """The frame header of a JPEG :func:`nvjpeg_friendly` takes (its size: no second parse), else None."""
    mv = memoryview(data).cast("B")
    if not is_jpeg(mv):
        return None
    frame = jpeg_frame(mv)
    if frame is None or frame.marker not in SEQUENTIAL_HUFFMAN:
        return None
    # grayscale: only as PIL and most encoders write it (1x1 sampling, what the probe decoded)
    return frame if frame.components == 3 or (gray and frame.components == 1 and frame.sampling == 0x11) else None


def gpu_decode_unavailable(device: torch.device) -> str | None:
    """None when batched nvJPEG decoding works on ``device``, else why not (probed once; the
    library is chosen in :mod:`shardkit.codec.backend`)."""
    return gpu_decoder(device)[2]


def gpu_decodes_gray(device: torch.device) -> bool:
    """Whether the batched decoder on ``device`` decodes grayscale JPEGs, in a batch with colour
    ones, to three equal channels within :data:`~shardkit.codec.backend.GRAY_TOLERANCE` of PIL's
    ``convert("RGB")`` (probed once per device; a CPU ``device``: the CPU batch decoder)."""
    return gpu_gray(device)


class GpuJpegDecoder:
    """Decode lists of JPEG byte tensors on ``device`` in one batched nvJPEG call.

    ``decode`` runs on the caller's current CUDA stream; results are uint8 ``[3, H, W]``
    CHW-contiguous CUDA tensors. On a CPU ``device`` it decodes on the CPU with the same batch
    API (so the device pipeline can be exercised without a GPU). Raises ``RuntimeError`` from the
    library when an image in the list cannot be decoded (callers fall back per image).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def library(self) -> str:
        """``torchvision`` or ``torchcodec`` (empty when neither decodes on the device)."""
        return gpu_decoder(self.device)[0]

    def decode(self, datas: list[torch.Tensor]) -> list[torch.Tensor]:
        if not datas:
            return []
        if self.device.type == "cpu":  # the GPU pipeline run on the CPU (tests): libjpeg-turbo, same API
            return cpu_batch_decoder()(datas, self.device)
        _, decode, why = gpu_decoder(self.device)
        if decode is None:
            raise RuntimeError(f"no batched CUDA JPEG decoder on {self.device}: {why}")
        return decode(datas, self.device)
