"""Which library decodes images, torchvision or TorchCodec: the one place that chooses.

torchvision deprecated its image decoders in 0.29 in favour of TorchCodec (``torchcodec``, from
0.16); both decode JPEGs with libjpeg-turbo on the CPU and with nvJPEG on CUDA. Everything in
shardkit that decodes through either library gets its decoder from here:

* CPU (:func:`cpu_decoder`, used by :func:`shardkit.codec.decode.decode_rgb` for JPEG and WebP):
  the first of :data:`CPU_ORDER` that imports and decodes a probe JPEG exactly as PIL does;
  ``pil`` (no native decoder) when none does. In the default order JPEGs first go to
  shardkit's own libjpeg extension (:func:`jpeg_by_shardkit`, :mod:`shardkit.codec.libjpeg`),
  which reports libjpeg's warnings instead of printing them; the library takes the rest.
* CUDA (:func:`gpu_decoder`, used by :class:`shardkit.codec.nvjpeg.GpuJpegDecoder`): the first
  of :data:`GPU_ORDER` that decodes a probe batch on the device.

:func:`prefer_decoder` (``"torchcodec"`` or ``"torchvision"``) puts that library first for both,
the others staying as fallbacks; ``"pil"`` turns the native CPU decoder off; ``None`` restores the
default order. It is an explicit call, not an environment variable (no ambient configuration in
the library): make it before building the loader. Its workers inherit it when forked, and its
feeder processes are given the choice in force when it was built. The choice is made once per
process and remade after each :func:`prefer_decoder`.

Both libraries return the same pixels (measured: every JPEG of the benchmark set identical, see
docs/performance.md "Which library decodes JPEGs"), with one difference handled here: TorchCodec always
applies the EXIF orientation, which shardkit does not (``decode_rgb`` equals PIL's
``convert("RGB")``, as torchvision's ImageFolder does). On the CPU a JPEG with an orientation
tag other than 1 is handed back (``RuntimeError``; ``decode_rgb`` then decodes it with PIL); on
CUDA the rotation is undone on the device (:func:`undo_exif_orientation`).
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Callable, Sequence

import torch

from shardkit._compat import torchvision_image_ops
from shardkit.codec.jpeg_header import exif_orientation

__all__ = ["CPU_ORDER", "GPU_ORDER", "GRAY_TOLERANCE", "cpu_batch_decoder", "cpu_decoder", "gpu_decoder", "gpu_gray",
           "jpeg_by_shardkit", "prefer_decoder", "preferred_decoder", "undo_exif_orientation"]

#: The names :func:`prefer_decoder` accepts.
LIBRARIES = ("torchvision", "torchcodec", "pil")
_preferred: str | None = None
#: CPU order. ``torchvision``: its registered ops (``torch.ops.image``, no deprecation warning
#: per call); ``torchvision.io``: its public (deprecated) functions, for builds whose op
#: signatures differ. torchvision first: TorchCodec measured no faster on this path (docs/performance.md).
CPU_ORDER: tuple[str, ...] = ("torchvision", "torchvision.io", "torchcodec")
#: CUDA order: torchvision's batched nvJPEG first until TorchCodec's is measured on a GPU
#: (``python -m benchmarks.experiments.decoders.bench_decoders --device cuda``).
GPU_ORDER: tuple[str, ...] = ("torchvision", "torchcodec")

#: ``(encoded uint8 1-D CPU tensor, kind)`` -> ``[3, H, W]`` uint8; kind is ``jpeg`` or ``webp``.
CpuDecoder = Callable[[torch.Tensor, str], torch.Tensor]
#: ``(list of encoded uint8 1-D CPU tensors, device)`` -> list of CHW-contiguous ``[3, H, W]``.
GpuDecoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def prefer_decoder(name: str | None) -> None:
    """Try ``name`` first (``"torchvision"``, ``"torchcodec"``; ``"pil"``: no native CPU decoder),
    or the default order with ``None``; the next decode chooses again.

    Raises:
        ValueError: an unknown name.
    """
    global _preferred
    if name is not None and name not in LIBRARIES:
        raise ValueError(f"decoder library must be one of {LIBRARIES} or None, got {name!r}")
    _preferred = name
    cpu_decoder.cache_clear()
    gpu_decoder.cache_clear()
    gpu_gray.cache_clear()


def preferred_decoder() -> str | None:
    """The library :func:`prefer_decoder` put first in this process (None: the default order)."""
    return _preferred


def jpeg_by_shardkit() -> bool:
    """Whether :func:`~shardkit.codec.decode.decode_rgb` decodes JPEGs with shardkit's own
    libjpeg extension (:mod:`shardkit.codec.libjpeg`) before the library: when it is built and
    no library was chosen with :func:`prefer_decoder` (a chosen library, or ``"pil"``, decodes
    them instead, as asked). Its pixels are those of torchvision's libjpeg-turbo decode; unlike
    torchvision it returns libjpeg's warnings about corrupt data instead of printing them."""
    from shardkit.codec import libjpeg

    return _preferred is None and libjpeg.available()


def _order(default: Sequence[str]) -> list[str]:
    want = _preferred
    if not want:
        return list(default)
    if want == "pil":
        return []
    first = [name for name in default if name.split(".")[0] == want]
    return first + [name for name in default if name not in first]


def _cpu_torchvision() -> CpuDecoder:
    if not torchvision_image_ops():
        import torchvision.io.image  # noqa: F401  (loads the image ops library)
    # 3: torchvision.io.ImageReadMode.RGB (cpu_decoder's probe against PIL catches a change)
    ops, rgb = torch.ops.image, 3
    calls = {"jpeg": lambda t: ops.decode_jpeg(t, rgb, False),  # False: EXIF orientation not applied
             "webp": lambda t: ops.decode_webp(t, rgb)}
    return lambda t, kind: calls[kind](t)


def _cpu_torchvision_io() -> CpuDecoder:
    from torchvision.io import ImageReadMode, decode_jpeg, decode_webp

    calls = {"jpeg": decode_jpeg, "webp": decode_webp}

    def decode(t: torch.Tensor, kind: str) -> torch.Tensor:
        with warnings.catch_warnings():  # deprecated in 0.29 in favour of TorchCodec
            warnings.simplefilter("ignore", DeprecationWarning)
            return calls[kind](t, mode=ImageReadMode.RGB)

    return decode


def _cpu_torchcodec() -> CpuDecoder:
    from torchcodec.decoders import decode_jpeg, decode_webp

    def decode(t: torch.Tensor, kind: str) -> torch.Tensor:
        if kind == "jpeg":
            if exif_orientation(t.numpy().data) > 1:  # TorchCodec would rotate it: PIL decodes it
                raise RuntimeError("EXIF orientation: decoded without TorchCodec")
            image = decode_jpeg(t, mode="RGB")
        else:
            image = decode_webp(t, mode="RGB")
        if not isinstance(image, torch.Tensor):  # one input, one image: a list would be a library change
            raise RuntimeError(f"TorchCodec returned {type(image).__name__} for one image")
        return image

    return decode


_CPU: dict[str, Callable[[], CpuDecoder]] = {
    "torchvision": _cpu_torchvision, "torchvision.io": _cpu_torchvision_io, "torchcodec": _cpu_torchcodec}


def _probe_jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 8), (200, 40, 90)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _gray_probe() -> tuple[bytes, torch.Tensor]:
    """A 40x24 grayscale JPEG with edges and a gradient (so a decoder's IDCT shows), and PIL's
    ``convert("RGB")`` of it as ``[3, H, W]``."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:24, 0:40]
    pixels = ((x * 6 + y * 3) % 256 ^ np.where((x // 8 + y // 8) % 2 == 1, 90, 0)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "L").save(buf, "JPEG", quality=85)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        want = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
    return buf.getvalue(), want


@functools.cache
def cpu_decoder() -> tuple[str, CpuDecoder | None]:
    """``(name, decoder)``: the first library of the order that imports and decodes a probe JPEG
    exactly as PIL; ``("pil", None)`` when none does (then PIL decodes everything)."""
    import numpy as np
    from PIL import Image

    probe = _probe_jpeg()
    with Image.open(io.BytesIO(probe)) as im:
        want = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
    for name in _order(CPU_ORDER):
        try:
            dec = _CPU[name]()
            got = dec(torch.frombuffer(bytearray(probe), dtype=torch.uint8), "jpeg")
            if torch.equal(got, want):
                return name, dec
        except Exception:  # library missing, broken or with another signature: try the next
            continue
    return "pil", None


def undo_exif_orientation(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """The ``[C, H, W]`` image before EXIF ``orientation`` (1-8) was applied to it, as TorchCodec
    applies it; other values return ``image`` unchanged.

    >>> x = torch.arange(6).view(1, 2, 3)
    >>> torch.equal(undo_exif_orientation(x.transpose(-1, -2).flip(-1), 6), x)
    True
    """
    flips = {2: (-1,), 3: (-2, -1), 4: (-2,), 5: (), 6: (-1,), 7: (-2, -1), 8: (-2,)}.get(orientation)
    if flips is None:
        return image
    out = image.flip(flips) if flips else image
    return out.transpose(-1, -2) if orientation >= 5 else out


def _gpu_torchvision() -> GpuDecoder:
    if not torchvision_image_ops():  # as the CPU decoder: no torchvision package import where it loads
        import torchvision.io.image  # noqa: F401  (loads the image ops library)
    # 3: torchvision.io.ImageReadMode.RGB (gpu_decoder's probe and cpu_decoder's against PIL catch a change)
    ops, rgb = torch.ops.image, 3

    def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        if device.type == "cuda":
            # the op torchvision's decode_jpeg calls, without its per-image checks and warning
            # filters: on the GPU route this runs beside the training loop, which waits for the GIL
            return list(ops.decode_jpegs_cuda(datas, rgb, device))
        return [ops.decode_jpeg(d, rgb, False) for d in datas]  # False: EXIF orientation not applied

    return decode


def _gpu_torchcodec() -> GpuDecoder:
    from torchcodec.decoders import decode_jpeg

    def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        out = list(decode_jpeg(datas, mode="RGB", device=device))
        for i, d in enumerate(datas):
            k = exif_orientation(d.numpy().data)
            if k > 1:  # TorchCodec applied it; shardkit's images are stored pixels, unrotated
                out[i] = undo_exif_orientation(out[i], k).contiguous()
        return out

    return decode


_GPU: dict[str, Callable[[], GpuDecoder]] = {"torchvision": _gpu_torchvision, "torchcodec": _gpu_torchcodec}


def cpu_batch_decoder() -> GpuDecoder:
    """The batch decode API of :func:`gpu_decoder`, on the CPU: torchvision's list decode, or
    :func:`cpu_decoder`'s one image at a time (for running the device pipeline without a GPU)."""
    try:
        return _gpu_torchvision()
    except ImportError:
        name, one = cpu_decoder()
        if one is None:
            raise RuntimeError("no native JPEG decoder on the CPU") from None
        return lambda datas, _device: [one(d, "jpeg").contiguous() for d in datas]


#: Largest mean absolute difference (levels) from PIL that :func:`gpu_gray` accepts on its probe:
#: IDCT rounding of another decoder, not a different image (nvJPEG's colour images differ from
#: PIL's by about 2.4 on the same scale, chroma upsampling included).
GRAY_TOLERANCE = 1.0


@functools.cache
def gpu_gray(device: torch.device) -> bool:
    """Whether :func:`gpu_decoder` on ``device`` (on a CPU ``device``, :func:`cpu_batch_decoder`)
    decodes a grayscale JPEG in a batch beside a colour one to ``[3, H, W]`` with three equal
    channels within :data:`GRAY_TOLERANCE` of PIL's ``convert("RGB")``."""
    gray, want = _gray_probe()
    colour = torch.frombuffer(bytearray(_probe_jpeg()), dtype=torch.uint8)
    try:
        decode = cpu_batch_decoder() if device.type == "cpu" else gpu_decoder(device)[1]
        if decode is None:
            return False
        got = decode([colour, torch.frombuffer(bytearray(gray), dtype=torch.uint8)], device)[1].cpu()
    except Exception:  # no decoder, or one that refuses grayscale or a mixed batch: the workers decode them
        return False
    if tuple(got.shape) != tuple(want.shape) or not (torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])):
        return False
    return (got.int() - want.int()).abs().float().mean().item() <= GRAY_TOLERANCE


@functools.cache
def gpu_decoder(device: torch.device) -> tuple[str, GpuDecoder | None, str | None]:
    """``(name, decoder, None)``: the first library of the order that decodes a probe batch of
    two JPEGs on CUDA ``device``; ``("", None, why not)`` when none does."""
    if device.type != "cuda":
        return "", None, f"device {device} is not a CUDA device"
    if not torch.cuda.is_available():
        return "", None, "CUDA is not available"
    probe = torch.frombuffer(bytearray(_probe_jpeg()), dtype=torch.uint8)
    why = []
    for name in _order(GPU_ORDER) or list(GPU_ORDER):
        try:
            dec = _GPU[name]()
            got = dec([probe, probe], device)
            if len(got) == 2 and tuple(got[0].shape) == (3, 8, 16) and got[0].device.type == "cuda":
                return name, dec, None
            why.append(f"{name}: probe returned {[tuple(g.shape) for g in got]}")
        except Exception as e:  # library missing, no CUDA image ops, no nvJPEG, driver trouble
            why.append(f"{name}: {type(e).__name__}: {e}")
    return "", None, "nvJPEG decode failed: " + "; ".join(why)
