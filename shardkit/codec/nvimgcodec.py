"""A second GPU JPEG decoder: the hardware JPEG engines through nvImageCodec (optional).

torchvision's batched nvJPEG call is serialised by one global lock, so one process decodes at
most one batch at a time with it. GPUs with hardware JPEG engines (A100, H100, H200) can decode
other batches at the same time through nvImageCodec (``nvidia.nvimgcodec``, the
``nvidia-nvimgcodec-cu13`` wheel plus ``nvidia-nvjpeg``). The prefetcher gives such a decoder a
thread of its own (one ``Decoder`` object per thread: it is not safe to share between threads)
and a CUDA stream of its own.

Opt-in (measured slower than nvJPEG alone beside 16 DataLoader workers on an H200, see
BENCHMARKS.md): ``ShardLoader(gpu=GpuOptions(hw_decode="mix"))`` runs it beside nvJPEG,
``"only"`` instead of nvJPEG, ``"off"`` (the default) not at all; ``hw_decode_threads``: nvImageCodec's CPU threads
(default 2). Safe: :func:`hw_decode_unavailable` imports the package and decodes a probe image
with the hardware backend only (``BackendKind.HW_GPU_ONLY``); when anything fails the loader
logs one line and keeps the torchvision-only path.

Outputs are planar RGB (``SampleFormat.P_RGB``) when the library offers it, else interleaved
and viewed as CHW. Each batch is copied into one torch-owned flat buffer on the decoder's stream
(then the stream is synchronised and nvImageCodec's images are dropped), so no memory owned by
nvImageCodec outlives the call; each image is a uint8 ``[3, H, W]`` CUDA view of that buffer.
Images the engines cannot take come back as ``None`` (callers decode those another way).
"""

from __future__ import annotations

import functools
import io
import logging
from typing import Any

import torch

__all__ = ["HwJpegDecoder", "hw_decode_unavailable"]

log = logging.getLogger(__name__)


def _nvimgcodec() -> Any:
    from nvidia import nvimgcodec  # type: ignore[import-not-found,import-untyped,attr-defined,unused-ignore]

    return nvimgcodec


class HwJpegDecoder:
    """Decode lists of JPEG byte tensors with the hardware JPEG engines of ``device``.

    Make one per thread and call it only from that thread. ``decode(datas, stream)`` enqueues on
    (and returns images ready on) ``stream``; positions the hardware could not decode are None.
    ``planar``: ask for planar RGB (else interleaved output viewed as CHW); ``threads``:
    nvImageCodec's CPU threads.
    """

    def __init__(self, device: torch.device, planar: bool = True, threads: int = 2) -> None:
        nv = _nvimgcodec()
        self.device, self.planar = device, planar
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._decoder = nv.Decoder(device_id=index, max_num_cpu_threads=threads,
                                   backends=[nv.Backend(nv.BackendKind.HW_GPU_ONLY)])
        spec = nv.ColorSpec.SRGB if hasattr(nv.ColorSpec, "SRGB") else nv.ColorSpec.RGB
        kw: dict[str, Any] = {"color_spec": spec, "allow_any_depth": False,
                              "apply_exif_orientation": False}
        if planar:
            kw["sample_format"] = nv.SampleFormat.P_RGB
        self._params = nv.DecodeParams(**kw)
        self._code_stream = nv.CodeStream

    def _tensor(self, image: Any) -> torch.Tensor:
        t = torch.as_tensor(image, device=self.device)
        if self.planar:
            return t  # [3, H, W] (the probe checks the shape)
        return t.permute(2, 0, 1)  # HWC memory, CHW view (callers flatten with reshape: one copy)

    def decode(self, datas: list[torch.Tensor],
               stream: torch.cuda.Stream) -> list[torch.Tensor | None]:
        if not datas:
            return []
        streams = [self._code_stream(d.numpy()) for d in datas]
        images = self._decoder.decode(streams, params=self._params, cuda_stream=stream.cuda_stream)
        views = [None if im is None else self._tensor(im) for im in images]
        good = [v for v in views if v is not None]
        if not good:
            return views
        with torch.cuda.stream(stream):  # copy out of nvImageCodec's memory, then let it go
            flat = torch.cat([v.reshape(-1) for v in good])
        stream.synchronize()
        del images, good
        out: list[torch.Tensor | None] = []
        pos = 0
        for v in views:
            if v is None:
                out.append(None)
                continue
            out.append(flat[pos:pos + v.numel()].view(3, v.shape[1], v.shape[2]))
            pos += v.numel()
        return out


def _probe_jpeg() -> tuple[torch.Tensor, torch.Tensor]:
    """A 320x240 4:2:0 JPEG and its CPU decode (CHW uint8)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:240, 0:320]
    rgb = np.stack([x * 3 // 4, y, (x + y) // 3], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=95)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        ref = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).contiguous()
    return data, ref


@functools.cache
def hw_decode_unavailable(device: torch.device, threads: int = 2) -> tuple[str | None, bool]:
    """``(None, planar)`` when hardware JPEG decoding works on ``device``, else
    ``(why not, False)``.

    Probed once per device (and thread count): decodes two copies of a small JPEG with
    ``HW_GPU_ONLY`` and checks shape and pixels against PIL (mean difference under 4 levels);
    planar output is tried first.
    """
    if device.type != "cuda" or not torch.cuda.is_available():
        return "not a CUDA device, or CUDA not available", False
    try:
        _nvimgcodec()
    except Exception as e:  # not installed, or its libraries (libnvjpeg) not found
        return f"nvidia.nvimgcodec not importable: {type(e).__name__}: {e}", False
    why = "no probe ran"
    for planar in (True, False):
        try:
            with torch.cuda.device(device):
                stream = torch.cuda.Stream(device)
                data, ref = _probe_jpeg()
                decoder = HwJpegDecoder(device, planar=planar, threads=threads)
                got = decoder.decode([data, data], stream)
                stream.synchronize()
            if any(g is None for g in got):
                why = "the hardware backend decoded nothing (no JPEG engines on this GPU?)"
                continue
            img = got[0].cpu()  # type: ignore[union-attr]
            if tuple(img.shape) != tuple(ref.shape):
                why = f"probe decoded to shape {tuple(img.shape)}, want {tuple(ref.shape)}"
                continue
            diff = (img.int() - ref.int()).abs().float().mean().item()
            if diff > 4.0:
                why = f"probe pixels differ from PIL by {diff:.1f} levels on average"
                continue
            return None, planar
        except Exception as e:  # driver, library or API trouble: keep the torchvision path
            why = f"hardware JPEG probe failed: {type(e).__name__}: {e}"
    return why, False
