"""Options of the GPU route (nvJPEG decode and one crop-resize-flip launch per batch)."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.errors import LoaderError

__all__ = ["GpuOptions"]


@dataclass(frozen=True)
class GpuOptions:
    """How the GPU route runs; ignored by the other routes.

    Args:
        compile: run crop-resize-flip as one Triton kernel per batch (True) or as the eager torch
            reference (False); both give the same pixels.
        device_prefetch: batches decoded ahead on the prefetch streams (>= 2).
        decode_threads: threads calling the batched GPU decoder, each on a CUDA stream of its own
            (>= 1). torchvision's nvJPEG serialises its calls, so more than one helps only with
            TorchCodec's decoder (``shardkit.codec.backend.prefer_decoder("torchcodec")``), which
            reaches the hardware JPEG engines: docs/performance.md, "Which library decodes JPEGs".

    Raises:
        LoaderError: a field is out of range (the message names it).

    Example:
        >>> GpuOptions(device_prefetch=4).device_prefetch
        4
        >>> GpuOptions(decode_threads=0)
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: decode_threads must be an int >= 1, got 0
    """

    compile: bool = True
    device_prefetch: int = 2
    decode_threads: int = 1

    def __post_init__(self) -> None:
        for name, least in (("device_prefetch", 2), ("decode_threads", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise LoaderError(f"{name} must be an int >= {least}, got {value!r}")
        if not isinstance(self.compile, bool):
            raise LoaderError(f"compile must be True or False, got {self.compile!r}")
