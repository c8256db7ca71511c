"""Decode encoded image bytes into uint8 RGB tensors: libjpeg-turbo fast path, PIL fallback.

The output always equals ``PIL.Image.open(f).convert("RGB")`` (what torchvision's ImageFolder
loader returns; EXIF orientation is not applied), within JPEG decoder rounding. JPEGs first go
to shardkit's own libjpeg extension (:mod:`shardkit.codec.libjpeg`; not when a library is chosen
with ``backend.prefer_decoder``); JPEG and WebP then go through a native decoder chosen once per
process by :mod:`shardkit.codec.backend` (torchvision's image ops, else TorchCodec); everything
else and anything the native decoder rejects goes through PIL. PNG always goes through PIL:
torchvision 0.29.1's ``decode_png`` segfaults on corrupt image data (any libpng read error), and
a worker must not die on a bad sample; PIL's PNG decode is as fast (both are libpng/zlib bound).

libjpeg's warnings about corrupt but decodable JPEGs ("Corrupt JPEG data: 3 extraneous bytes
before marker 0xda"), which torchvision's decoder prints to stderr, are counted in
:attr:`DecodeStats.warnings` (the loader's ``stats.decode_warnings``), and the first one in a
process is logged (logger ``shardkit.codec``) with the sample it came from. A JPEG the extension
does not decode (corrupt, or CMYK/YCCK) goes to PIL, not to the library (which would print
libjpeg's warnings).

Layout: the result is ``[3, H, W]`` whose memory is HWC (``stride() == (1, 3 * W, 3)``), which is
what both libjpeg and PIL produce and what the uint8 resize kernel reads fastest; call
``.contiguous()`` (about 0.5 ms for a 400x350 image) only if you need CHW memory.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from shardkit.codec import libjpeg
from shardkit.codec.backend import cpu_decoder, jpeg_by_shardkit
from shardkit.codec.jpeg_header import jpeg_frame
from shardkit.errors import DecodeError, reraise_interrupt

__all__ = ["DecodeStats", "decode_backend", "decode_rgb", "is_jpeg", "peek_size"]

Bytes = bytes | bytearray | memoryview
_PNG_SIG = b"\x89PNG\r\n\x1a\n"


@dataclass
class DecodeStats:
    """Counts of how images were decoded; pass one to :func:`decode_rgb` to fill it.

    ``fast``: native decoder; ``fallback``: PIL; ``failed``: raised :class:`DecodeError`;
    ``warnings``: images decoded despite libjpeg warnings about corrupt data (see the module doc).
    """

    fast: int = 0
    fallback: int = 0
    failed: int = 0
    warnings: int = 0


log = logging.getLogger("shardkit.codec")
_warned = [False]  # whether this process logged a libjpeg warning already


def _libjpeg_warning(message: str, where: str, stats: DecodeStats | None) -> None:
    """Count an image decoded with a libjpeg warning; log the first one of the process."""
    if stats is not None:
        stats.warnings += 1
    if not _warned[0]:
        _warned[0] = True
        log.warning("%s: libjpeg: %s; the image was decoded (further such warnings in this process are counted "
                    "in the loader's stats.decode_warnings, not logged)", where or "image", message)


def _buffer(data: Bytes | torch.Tensor) -> Bytes:
    if isinstance(data, torch.Tensor):  # encoded bytes as a 1-D uint8 CPU tensor
        if data.dtype != torch.uint8 or data.dim() != 1 or data.device.type != "cpu":
            raise DecodeError(f"encoded bytes must be a 1-D uint8 CPU tensor, got {data.dtype} "
                              f"{list(data.shape)} on {data.device}")
        return data.contiguous().numpy().data
    return data


def is_jpeg(data: Bytes | torch.Tensor) -> bool:
    """True when ``data`` starts with a JPEG SOI marker.

    Example: ``is_jpeg(b"\\xff\\xd8\\xff")``."""
    return bytes(_buffer(data)[:3]) == b"\xff\xd8\xff"


def _kind(data: Bytes) -> str:
    head = bytes(data[:32])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return "other"


def peek_size(data: Bytes | torch.Tensor) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, without decoding it (EXIF not applied).

    JPEG and PNG sizes are parsed from the first header bytes; other formats are opened
    (not decoded) with PIL, which may need the whole file.

    Raises :class:`DecodeError` when no size can be read. Example: ``h, w = peek_size(raw)``.
    """
    mv = memoryview(_buffer(data)).cast("B")
    if is_jpeg(mv):
        frame = jpeg_frame(mv)
        if frame is not None and frame.height > 0 and frame.width > 0:
            return frame.height, frame.width
    elif bytes(mv[:8]) == _PNG_SIG and len(mv) >= 24 and bytes(mv[12:16]) == b"IHDR":
        w, h = int.from_bytes(mv[16:20], "big"), int.from_bytes(mv[20:24], "big")
        return h, w
    try:
        with Image.open(io.BytesIO(mv)) as im:
            return im.height, im.width
    except Exception as e:  # PIL raises many types for bad headers
        reraise_interrupt(e)
        raise DecodeError(f"cannot read image size: {e}") from e


def _check_bomb(data: Bytes) -> None:
    limit = Image.MAX_IMAGE_PIXELS
    h, w = peek_size(data)
    if limit is not None and h * w > 2 * limit:  # the threshold where PIL raises
        raise DecodeError(f"image of {h}x{w} pixels exceeds PIL's decompression-bomb limit")


def decode_backend() -> str:
    """What decodes on the CPU: the native decoder in use (``torchvision``, ``torchvision.io``,
    ``torchcodec`` or ``pil``, chosen in :mod:`shardkit.codec.backend`), preceded by
    ``shardkit-libjpeg+`` when JPEGs go to shardkit's own extension first
    (:func:`~shardkit.codec.backend.jpeg_by_shardkit`), e.g. ``"shardkit-libjpeg+torchvision"``."""
    native = cpu_decoder()[0]
    return f"shardkit-libjpeg+{native}" if jpeg_by_shardkit() else native


def _pil_rgb(data: Bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as im:
        arr = np.asarray(im.convert("RGB"))
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr).permute(2, 0, 1)


def _reason(err: Exception) -> str:
    """A decoder's error in words, without the object addresses PIL puts in some
    (``cannot identify image file <_io.BytesIO object at 0x7f…>``)."""
    return re.sub(r"\s*<[^<>]* object at 0x[0-9a-f]+>", "", str(err)) or type(err).__name__


def decode_rgb(
    data: Bytes | torch.Tensor, *, where: str = "", stats: DecodeStats | None = None
) -> torch.Tensor:
    """Decode any encoded image to a uint8 ``[3, H, W]`` RGB tensor (HWC memory, see module doc).

    Args:
        data: the encoded bytes, or a 1-D uint8 CPU tensor of them (a writable buffer avoids
            one copy).
        where: context for errors (shard/member/key).
        stats: optional counters of which path decoded the image.
    Returns:
        ``PIL.Image.open(...).convert("RGB")`` as a tensor, within JPEG decoder rounding.
    Raises:
        DecodeError: empty, corrupt, truncated or non-image bytes, or an image above PIL's
            decompression-bomb limit.
    Example:
        >>> img = decode_rgb(open("cat.jpg", "rb").read(), where="cat.jpg")  # doctest: +SKIP
    """
    try:
        data = _buffer(data)
        if len(data) == 0:
            raise DecodeError("empty image data")
        kind = _kind(data)
        _, native = cpu_decoder()
        own = kind == "jpeg" and jpeg_by_shardkit()
        if kind != "other" and (own or native is not None):
            _check_bomb(data)  # PIL checks for itself; the native decoders would decode anything
        if own:
            # The library would print libjpeg's warnings: what the extension does not decode
            # (corrupt data, CMYK/YCCK colour spaces, rare) goes to PIL.
            native = None
            try:
                got = libjpeg.decode_jpeg(data)
            except ValueError:
                got = None
            if got is not None:
                if got.warning is not None:
                    _libjpeg_warning(got.warning, where, stats)
                if stats is not None:
                    stats.fast += 1
                return got.image
        if native is not None and kind != "other":
            mv = memoryview(data)
            buf = mv if not mv.readonly else bytearray(mv)  # frombuffer warns on read-only
            try:
                img = native(torch.frombuffer(buf, dtype=torch.uint8), kind)
                if img.dtype == torch.uint8 and img.dim() == 3 and img.shape[0] == 3:
                    if stats is not None:
                        stats.fast += 1
                    return img
            except RuntimeError:  # unsupported variant or corrupt: PIL decides which
                pass
        img = _pil_rgb(data)
        if stats is not None:
            stats.fallback += 1
        return img
    except DecodeError as e:
        if stats is not None:
            stats.failed += 1
        raise DecodeError(e.message, where=where) from e.__cause__
    except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, bomb errors, …
        reraise_interrupt(e)  # Ctrl-C wrapped by a lazy plugin import is not a bad image
        if stats is not None:
            stats.failed += 1
        raise DecodeError(f"cannot decode image: {_reason(e)}", where=where) from e
