"""The indexed generator: tiny flat-colour images whose colour encodes each image's global index
in ImageFolder order; :func:`decode_index` recovers it from a decoded image even after JPEG, crop,
resize and flip. For checking sample order in loader tests. The CLI is :mod:`sample_data.generate`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

#: Indexed images: each RGB channel takes one of ``LEVELS`` values ``0, STEP, ..., 255``.
LEVELS = 16
STEP = 255 // (LEVELS - 1)  # 17: decoding tolerates ±8 per channel, JPEG q95 errs by ≤ 3.
MAX_INDEXED = LEVELS**3  # 4096 distinct indices

_INDEXED_EXTS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP"}


def index_color(index: int) -> tuple[int, int, int]:
    """The RGB colour that encodes ``index`` (base-``LEVELS`` digits, red most significant).

    Raises:
        ValueError: ``index`` is outside ``[0, MAX_INDEXED)``.
    """
    if not 0 <= index < MAX_INDEXED:
        raise ValueError(f"index {index} outside [0, {MAX_INDEXED})")
    r, rest = divmod(index, LEVELS * LEVELS)
    g, b = divmod(rest, LEVELS)
    return (r * STEP, g * STEP, b * STEP)


def decode_index(image: Any) -> int:
    """Recover the index from a decoded indexed image (inverse of :func:`index_color`).

    Uses the mean colour of the central half (in each dimension) of the image, so any crop,
    resize, flip or JPEG re-encode at quality >= 90 of a flat indexed image decodes correctly.

    Args:
        image: one RGB image as a torch tensor or numpy array, channels-first ``(3, H, W)`` or
            channels-last ``(H, W, 3)`` (a leading batch dim of 1 is allowed). ``uint8`` or
            float in ``[0, 255]`` or ``[0, 1]`` (a float image whose maximum is <= 1 is taken
            as ``[0, 1]``). Mean/std-normalised tensors are not supported.

    Returns:
        The image's global index.

    Raises:
        ValueError: the shape is not an RGB image, or the colour is not near any index colour.

    Example:
        >>> import numpy as np
        >>> decode_index(np.full((8, 8, 3), index_color(77), dtype=np.uint8))
        77
    """
    arr = np.asarray(image.detach().cpu() if hasattr(image, "detach") else image)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3 or 3 not in (arr.shape[0], arr.shape[-1]):
        raise ValueError(f"expected one RGB image (3,H,W) or (H,W,3), got shape {arr.shape}")
    if arr.shape[-1] != 3:  # channels-first
        arr = np.moveaxis(arr, 0, -1)
    is_float = np.issubdtype(arr.dtype, np.floating)
    arr = arr.astype(np.float64)
    if is_float and arr.max() <= 1.0:
        arr = arr * 255.0
    h, w = arr.shape[:2]
    centre = arr[h // 4 : max(h // 4 + 1, 3 * h // 4), w // 4 : max(w // 4 + 1, 3 * w // 4)]
    mean = centre.reshape(-1, 3).mean(axis=0)
    digits = np.rint(mean / STEP)
    if np.abs(mean - digits * STEP).max() > STEP / 2 - 1 or not (digits >= 0).all():
        raise ValueError(f"mean colour {mean.round(1).tolist()} is not an index colour")
    r, g, b = (int(d) for d in digits)
    return (r * LEVELS + g) * LEVELS + b


def indexed_class_name(cls: int) -> str:
    """The folder name of class ``cls`` in an indexed tree, e.g. ``c003``."""
    return f"c{cls:03d}"


def make_indexed_imagefolder(
    root: str | os.PathLike[str],
    *,
    classes: int = 3,
    per_class: int = 5,
    size: tuple[int, int] = (64, 48),
    seed: int = 0,
    ext: str = "jpg",
) -> list[Path]:
    """Write a tiny ImageFolder tree whose image ``i`` (ImageFolder order) is flat
    ``index_color(i)``.

    Layout: ``root/c<k:03d>/<j:06d>.<ext>``; global index ``i = k * per_class + j`` is both the
    position in torchvision ``ImageFolder`` order and what :func:`decode_index` returns for it.
    JPEGs are written at quality 95, WebP losslessly.

    Args:
        root: output folder; created if missing.
        classes: number of class folders (> 0).
        per_class: images per class (> 0); ``classes * per_class <= MAX_INDEXED`` (4096).
        size: (width, height) of every image.
        seed: accepted for a uniform generator signature; the output does not depend on it.
        ext: file extension: ``jpg``, ``jpeg``, ``png``, ``webp`` or ``bmp`` (any case; the
            case is kept in the file names).

    Returns:
        The written paths, path ``i`` holding index ``i``.

    Raises:
        ValueError: bad counts, size or extension, or more than ``MAX_INDEXED`` images.

    Example:
        >>> paths = make_indexed_imagefolder("/tmp/idx", classes=2, per_class=2)  # doctest: +SKIP
        >>> [p.name for p in paths]  # doctest: +SKIP
        ['000000.jpg', '000001.jpg', '000000.jpg', '000001.jpg']
    """
    del seed  # deterministic by construction
    fmt = _INDEXED_EXTS.get(ext.lower().lstrip("."))
    if fmt is None:
        raise ValueError(f"unsupported ext {ext!r}; use one of {sorted(_INDEXED_EXTS)}")
    if classes <= 0 or per_class <= 0 or min(size) <= 0:
        raise ValueError(f"need classes, per_class, size > 0; got {classes}, {per_class}, {size}")
    if classes * per_class > MAX_INDEXED:
        raise ValueError(f"{classes * per_class} images > MAX_INDEXED ({MAX_INDEXED})")
    root = Path(root)
    suffix = ext.lstrip(".")
    presets: dict[str, dict[str, Any]] = {"JPEG": {"quality": 95}, "WEBP": {"lossless": True}}
    options = presets.get(fmt, {})
    paths = []
    for k in range(classes):
        folder = root / indexed_class_name(k)
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            path = folder / f"{j:06d}.{suffix}"
            image = Image.new("RGB", (size[0], size[1]), index_color(k * per_class + j))
            image.save(path, fmt, **options)
            paths.append(path)
    return paths
