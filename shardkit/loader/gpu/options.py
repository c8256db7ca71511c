"""Options of the GPU route (nvJPEG decode and one crop-resize-flip launch per batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardkit.errors import LoaderError

__all__ = ["HW_DECODE", "GpuOptions"]

HW_DECODE = ("off", "mix", "only")


@dataclass(frozen=True)
class GpuOptions:
    """How the GPU route runs; ignored by the other routes.

    Args:
        compile: run crop-resize-flip as one Triton kernel per batch (True) or as the eager torch
            reference (False); both give the same pixels.
        device_prefetch: batches decoded ahead on the prefetch streams (>= 2).
        hw_decode: also decode JPEGs with the GPU's hardware JPEG engines through nvImageCodec,
            ``"mix"`` (beside nvJPEG) or ``"only"`` (instead of it). Experimental and off by
            default: it was slower than nvJPEG alone in our H200 measurements (BENCHMARKS.md),
            and ``"mix"`` breaks bit-exact resume (which decoder takes a batch depends on timing).
        hw_decode_threads: CPU threads of the nvImageCodec decoder (>= 1).
        decode_threads: threads calling the batched GPU decoder, each on a CUDA stream of its own
            (>= 1). torchvision's nvJPEG serialises its calls, so more than one helps only with
            TorchCodec's decoder (``shardkit.codec.backend.prefer_decoder("torchcodec")``), which
            reaches the hardware JPEG engines: BENCHMARKS.md, "Which library decodes".

    Raises:
        LoaderError: a field is out of range (the message names it).

    Example:
        >>> GpuOptions(device_prefetch=4).device_prefetch
        4
        >>> GpuOptions(hw_decode="yes")
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: hw_decode must be one of ('off', 'mix', 'only'), got 'yes'
    """

    compile: bool = True
    device_prefetch: int = 2
    hw_decode: Literal["off", "mix", "only"] = "off"
    hw_decode_threads: int = 2
    decode_threads: int = 1

    def __post_init__(self) -> None:
        for name, least in (("device_prefetch", 2), ("hw_decode_threads", 1), ("decode_threads", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise LoaderError(f"{name} must be an int >= {least}, got {value!r}")
        if self.hw_decode not in HW_DECODE:
            raise LoaderError(f"hw_decode must be one of {HW_DECODE}, got {self.hw_decode!r}")
        if not isinstance(self.compile, bool):
            raise LoaderError(f"compile must be True or False, got {self.compile!r}")
