"""Turn one source sample's bytes into the fields of its shard entry, or a reason to skip it
(reading the bytes is the source's: :meth:`shardkit.sources.files.Files.read_each`)."""

from __future__ import annotations

import io
import json
import os
import warnings
from collections.abc import Callable
from typing import Any

from PIL import Image, UnidentifiedImageError

from shardkit.codec import jpeg_restart
from shardkit.errors import PackError
from shardkit.format.spec import PIL_FORMAT_EXTENSIONS, normalize_extension
from shardkit.pack.options import PackOptions
from shardkit.sources.base import SourceSample
from shardkit.sources.files import SkipSample

__all__ = ["SkipSample", "check_decodes", "encode_sample"]

#: How close to the end of the file the end marker must be (some writers append a few bytes).
_TAIL = 1024


def _open(data: bytes) -> Image.Image:
    try:  # warnings (PIL's decompression-bomb one too, as ImageFolder loads such images): see encode_sample
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as err:
        raise SkipSample(f"decompression bomb refused ({err})") from err
    except UnidentifiedImageError as err:
        raise SkipSample("not an image (no image format recognised)") from err
    except (OSError, ValueError, SyntaxError) as err:
        raise SkipSample(f"unreadable image header ({err})") from err


def _decodes(data: bytes) -> None:
    """Decode ``data`` as the loader's CPU decoder does when all else fails (PIL's
    ``convert("RGB")``, which :func:`shardkit.codec.decode.decode_rgb` equals); raise
    ``OSError``/``ValueError``/... where it cannot."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(io.BytesIO(data)) as img:
            img.convert("RGB")


def check_decodes(img: Image.Image, data: bytes, full_decode: bool) -> None:
    """Raise ``SkipSample`` unless the loader's CPU decoder decodes ``data`` (the acceptance
    rule, README "Pack"): PNG and every other format are decoded in full; a JPEG (or MPO)
    whose end-of-image marker ends the file is taken on that evidence alone unless
    ``full_decode``, so that packing JPEGs stays cheap (libjpeg decodes almost all of those;
    ``decode_check`` finds the rest). Without the marker in its last ``_TAIL`` bytes a JPEG is
    decoded too: PIL loads one with a long trailer and refuses a truncated one."""
    fmt = img.format
    jpeg = fmt in ("JPEG", "MPO")
    if jpeg and not full_decode and b"\xff\xd9" in data[-_TAIL:]:
        return
    try:
        _decodes(data)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        if jpeg and b"\xff\xd9" not in data[-_TAIL:]:
            raise SkipSample(f"truncated JPEG (no end-of-image marker; {err})") from err
        if fmt == "PNG" and b"IEND" not in data[-_TAIL:]:
            raise SkipSample(f"truncated PNG (no IEND chunk; {err})") from err
        raise SkipSample(f"corrupt image data ({err})") from err


def _reencode(img: Image.Image, shorter: int, quality: int) -> tuple[bytes, int, int]:
    width, height = img.size
    scale = shorter / min(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    out = io.BytesIO()
    try:  # the full decode happens here: the cheap checks before it cannot see corrupt scan data
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resized = img.convert("RGB").resize(size, Image.Resampling.BICUBIC)
            resized.save(out, "JPEG", quality=quality)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise SkipSample(f"corrupt image data ({err})") from err
    return out.getvalue(), size[0], size[1]


def _restart_indexed(data: bytes, max_interval: int, where: str) -> bytes:
    """``data`` (a JPEG) re-encoded with restart markers, or as it is when not YCbCr/grayscale."""
    # checked by PackOptions too; this catches a Ray node without it
    if not jpeg_restart.available():
        raise PackError("jpeg_restart is set but shardkit's C extension is not built on "
                        "this machine", where=where)
    try:
        restarted = jpeg_restart.transcode(data, max_interval)
    except ValueError as err:  # libjpeg found the scan damaged, warnings included
        try:  # the acceptance rule: what the loader decodes is packed, here with its own bytes
            _decodes(data)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            raise SkipSample(f"corrupt image data ({err})") from err
        return data
    return data if restarted is None else restarted


def encode_sample(
    sample: SourceSample, data: bytes, *, classes: list[str] | None, options: PackOptions,
    on_size: Callable[[int, int], None] | None = None,
) -> list[tuple[str, bytes]]:
    """The ``(ext, bytes)`` fields of ``sample``'s shard entry (image, ``cls`` or ``txt``, ``json``).

    The image keeps its original bytes unless ``options.resize_max`` asks for re-encoding or
    ``options.jpeg_restart`` for restart markers (JPEG only, applied to the final bytes; a JPEG
    libjpeg will not transcode losslessly but PIL decodes keeps its bytes); its extension comes
    from the detected format (``jpg``, ``png`` …). Raises ``SkipSample`` for empty, non-image,
    decompression-bomb inputs and images the loader's CPU decoder cannot decode (the
    acceptance rule, :func:`check_decodes`), and ``PackError`` when ``jpeg_restart`` is set on
    a machine without the C extension.

    PIL's warnings about damaged metadata (``Corrupt EXIF data`` …) are silenced: they concern
    no pixel the loader delivers, and would otherwise reach the terminal of ``pack -q``.

    ``on_size`` is called with the image's width and height as read from its header (before any
    re-encoding), once the header is read.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _encode(sample, data, classes=classes, options=options, on_size=on_size)


def _encode(sample: SourceSample, data: bytes, *, classes: list[str] | None,
            options: PackOptions, on_size: Callable[[int, int], None] | None) -> list[tuple[str, bytes]]:
    img = _open(data)
    width, height = img.size
    if on_size is not None:
        on_size(width, height)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > 2 * limit:  # where PIL refuses to decode, and ImageFolder with it
        raise SkipSample(f"decompression bomb refused ({width}x{height} pixels, over twice PIL's "
                         f"Image.MAX_IMAGE_PIXELS of {limit})")
    ext = PIL_FORMAT_EXTENSIONS.get(img.format or "",
                                    normalize_extension(os.path.splitext(sample.path)[1]))
    restart = options.jpeg_restart
    if options.resize_max is not None and min(width, height) > options.resize_max:
        # re-encoding decodes in full: the same decode as check_decodes's, done once
        data, width, height = _reencode(img, options.resize_max, options.quality)
        ext = "jpg"
    else:
        check_decodes(img, data, options.decode_check)
        if img.format != "JPEG":  # MPO too: re-encoding its first picture would orphan the others
            restart = None
    if restart is not None:
        data = _restart_indexed(data, restart, sample.rel)
    doc: dict[str, Any] = {"source": sample.rel}
    fields = [(ext, data)]
    if sample.caption is not None:  # a captioned image: its extra fields, then shardkit's own over them
        doc = {**(sample.meta or {}), "source": sample.rel, "width": width, "height": height}
        fields.append(("txt", sample.caption.encode("utf-8", "backslashreplace")))
    elif sample.label is not None:
        doc.update(label=sample.label, width=width, height=height)
        if classes is not None:
            doc["class"] = classes[sample.label]
        fields.append(("cls", str(sample.label).encode("ascii")))
    if sample.caption is None and sample.meta is not None:
        doc.update(sample.meta)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # A lone surrogate (e.g. from a "\\udce9" escape in a COCO json) becomes that same JSON escape.
    fields.append(("json", text.encode("utf-8", "backslashreplace")))
    return fields
