"""Seeded generators of ImageFolder trees for tests and benchmarks (no network, no skimage).

Two generators, both byte-reproducible for a given seed (and Pillow/libjpeg version), whatever
the number of worker processes:

* :func:`make_imagenet_like` — realistic JPEGs (~400x350 px, ~50-100 KB, q75-95, a few
  grayscale/CMYK/PNG files) cut from the real photos shipped in ``sample_data/photos/``.
  For throughput benchmarks and pack/load round-trips at scale.
* :func:`make_indexed_imagefolder` — tiny flat-colour images whose colour encodes each image's
  global index in ImageFolder order; :func:`decode_index` recovers it from a decoded image even
  after JPEG, crop, resize and flip. For checking sample order in loader tests.

CLI, from the repository root::

    python -m sample_data.generate imagenet-like OUT --classes 10 --per-class 100 --seed 0 \\
        --workers 2
    python -m sample_data.generate indexed OUT --classes 3 --per-class 5 --ext jpg
"""

from __future__ import annotations

import argparse
import functools
import io
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageChops

PHOTO_DIR = Path(__file__).resolve().parent / "photos"

#: Indexed images: each RGB channel takes one of ``LEVELS`` values ``0, STEP, ..., 255``.
LEVELS = 16
STEP = 255 // (LEVELS - 1)  # 17: decoding tolerates ±8 per channel, JPEG q95 errs by ≤ 3.
MAX_INDEXED = LEVELS**3  # 4096 distinct indices

_INDEXED_EXTS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP"}


# --------------------------------------------------------------------------- ImageNet-like


@functools.lru_cache(maxsize=4)
def _photos(photo_dir: str) -> tuple[Image.Image, ...]:
    """The shipped source photos as loaded RGB images, sorted by file name (cached per process)."""
    files = sorted(Path(photo_dir).glob("*.jpg"))
    if not files:
        raise FileNotFoundError(f"no source photos (*.jpg) in {photo_dir}")
    out = []
    for f in files:
        with Image.open(f) as im:
            out.append(im.convert("RGB"))
    return tuple(out)


#: Grain amplitudes (std of added noise, in grey levels); one is picked per image.
_GRAIN = (10, 12, 14, 16, 18)
_TILE = 768


@functools.lru_cache(maxsize=len(_GRAIN))
def _grain_tile(sigma: int) -> Image.Image:
    """A fixed RGB tile of ``128 + sigma * N(0, 1)`` noise; windows of it add sensor-like grain."""
    noise = np.random.default_rng(sigma).standard_normal((_TILE, _TILE, 3), dtype=np.float32)
    return Image.fromarray(np.clip(128 + sigma * noise, 0, 255).astype(np.uint8), "RGB")


@dataclass(frozen=True)
class OddFiles:
    """The shares of an ImageNet-like tree's files that are not colour JPEGs: PNGs, CMYK JPEGs and
    grayscale JPEGs (each a fraction of the files, drawn per image; together at most 1).

    The default makes about 4% of the files odd, so that every route meets each kind in a small
    tree. ImageNet-1k's training set has far fewer: 1 PNG and 22 CMYK JPEGs in its 1,281,167
    files (:data:`IMAGENET_ODD_FILES`, grayscale left at the default). Such files cost a loader
    much more than colour JPEGs (decoded on the CPU where a GPU decoder does not take them), so
    the shares move a loader's CPU cost per image.

    Example:
        >>> OddFiles(png=0.0).thresholds()
        (0.0, 0.01, 0.03)
    """

    png: float = 0.01
    cmyk: float = 0.01
    gray: float = 0.02

    def __post_init__(self) -> None:
        shares = (self.png, self.cmyk, self.gray)
        if any(not 0.0 <= s <= 1.0 for s in shares) or sum(shares) > 1.0:
            raise ValueError(f"odd-file shares must be in [0, 1] and add up to at most 1, got png={self.png}, "
                             f"cmyk={self.cmyk}, gray={self.gray}")

    def thresholds(self) -> tuple[float, float, float]:
        """Upper bounds of each kind on one uniform draw per image: PNG below the first, CMYK
        below the second, grayscale below the third."""
        return self.png, self.png + self.cmyk, self.png + self.cmyk + self.gray


#: ImageNet-1k's own shares: 1 PNG and 22 CMYK JPEGs in 1,281,167 training files.
IMAGENET_ODD_FILES = OddFiles(png=1 / 1_281_167, cmyk=22 / 1_281_167)


def _imagenet_like_bytes(
    index: int, cls: int, seed: int, size: tuple[int, int], photo_dir: str, odd: OddFiles = OddFiles()
) -> tuple[str, bytes]:
    """Encode image ``index`` (of class ``cls``); return (file suffix, encoded bytes).

    Every random draw comes from a generator seeded by ``(seed, index)`` alone, so the bytes do
    not depend on which process makes the image or in which order.
    """
    rng = np.random.default_rng([seed, index])
    photos = _photos(photo_dir)
    src = photos[cls % len(photos)]
    # Output size: nominal size ±15% per side, as ImageNet's sizes vary.
    w = max(16, round(size[0] * rng.uniform(0.85, 1.15)))
    h = max(16, round(size[1] * rng.uniform(0.85, 1.15)))
    # A box of the source with the output's aspect ratio, 35-100% of the source's width/height.
    frac = rng.uniform(0.35, 1.0)
    cw = min(src.width, round(src.width * frac))
    ch = min(src.height, max(8, round(cw * h / w)))
    cw = min(src.width, max(8, round(ch * w / h)))
    x = int(rng.integers(0, src.width - cw + 1))
    y = int(rng.integers(0, src.height - ch + 1))
    img = src.resize((w, h), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    # Colour jitter: per-channel gain and offset, applied as a lookup table.
    gain = rng.uniform(0.75, 1.25) * rng.uniform(0.9, 1.1, size=3)
    bias = rng.uniform(-20, 20) + rng.uniform(-8, 8, size=3)
    lut = np.clip(np.arange(256)[None, :] * gain[:, None] + bias[:, None], 0, 255)
    img = img.point(np.rint(lut).astype(np.uint8).ravel().tolist())
    # Grain: add a random window of a noise tile (tiled when the image is larger than it).
    tile = _grain_tile(_GRAIN[int(rng.integers(0, len(_GRAIN)))])
    nx, ny = int(rng.integers(0, _TILE)), int(rng.integers(0, _TILE))
    if w + nx > _TILE or h + ny > _TILE:
        nx = ny = 0
    if w > _TILE or h > _TILE:
        tiled = Image.new("RGB", (w, h))
        for ty in range(0, h, _TILE):
            for tx in range(0, w, _TILE):
                tiled.paste(tile, (tx, ty))
        tile = tiled
    img = ImageChops.add(img, tile.crop((nx, ny, nx + w, ny + h)), scale=1.0, offset=-128)

    kind = rng.random()
    quality = int(rng.integers(75, 96))
    buf = io.BytesIO()
    png, cmyk, gray = odd.thresholds()
    if kind < png:
        img.save(buf, "PNG", compress_level=1)
        return ".png", buf.getvalue()
    if kind < cmyk:
        img = img.convert("CMYK")
    elif kind < gray:
        img = img.convert("L")
    img.save(buf, "JPEG", quality=quality)
    return ".JPEG", buf.getvalue()


def _write_imagenet_like(
    job: tuple[int, int, Path, int, tuple[int, int], str, OddFiles],
) -> Path:
    """Worker entry: make image ``index`` and write it to ``<stem><suffix>``."""
    index, cls, stem, seed, size, photo_dir, odd = job
    suffix, data = _imagenet_like_bytes(index, cls, seed, size, photo_dir, odd)
    path = stem.with_suffix(suffix)
    path.write_bytes(data)
    return path


def imagenet_class_name(cls: int) -> str:
    """The WordNet-id-like folder name of class ``cls``, e.g. ``n00000003``."""
    return f"n{cls:08d}"


def make_imagenet_like(
    root: str | os.PathLike[str],
    *,
    classes: int = 10,
    per_class: int = 100,
    seed: int = 0,
    size: tuple[int, int] = (400, 350),
    workers: int = 0,
    photo_dir: str | os.PathLike[str] = PHOTO_DIR,
    odd: OddFiles = OddFiles(),
) -> list[Path]:
    """Write an ImageFolder tree of ImageNet-like images under ``root``.

    Layout: ``root/n0000000<c>/n0000000<c>_<j:05d>.JPEG`` (``.png`` for ~1% of files). Each
    class draws mostly on one shipped photo (class ``c`` on photo ``c mod n``), with random
    crops, rescales, flips, colour jitter and grain. About 2% of files are grayscale JPEGs, 1%
    CMYK JPEGs and 1% PNGs (``odd``); JPEG quality is 75-95. At the default ``size`` (width, height),
    sizes are ±15% per side and files are roughly 50-100 KB.

    Args:
        root: output folder; created if missing. Existing files of the same names are replaced.
        classes: number of class folders (> 0).
        per_class: images per class (> 0).
        seed: the output is byte-identical for equal seeds (and Pillow/libjpeg versions),
            whatever ``workers`` is.
        size: nominal (width, height) in pixels.
        workers: processes to use; 0 or 1 runs in this process.
        photo_dir: folder of source ``*.jpg`` photos (default: the shipped ``photos/``).
        odd: the shares of PNGs, CMYK and grayscale JPEGs (:class:`OddFiles`; e.g.
            :data:`IMAGENET_ODD_FILES`). A file that is a colour JPEG under two settings has the same bytes under both.

    Returns:
        The written paths in torchvision ``ImageFolder`` order (classes, then files, sorted).

    Raises:
        ValueError: ``classes``, ``per_class`` or ``size`` is not positive.
        FileNotFoundError: ``photo_dir`` holds no ``*.jpg``.

    Example:
        >>> paths = make_imagenet_like("/tmp/inet", classes=2, per_class=3)  # doctest: +SKIP
        >>> len(paths)  # doctest: +SKIP
        6
    """
    if classes <= 0 or per_class <= 0 or min(size) <= 0:
        raise ValueError(f"need classes, per_class, size > 0; got {classes}, {per_class}, {size}")
    root = Path(root)
    photo_key = str(Path(photo_dir).resolve())
    _photos(photo_key)  # fail fast
    jobs = []
    for c in range(classes):
        folder = root / imagenet_class_name(c)
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            stem = folder / f"{imagenet_class_name(c)}_{j:05d}"
            jobs.append((c * per_class + j, c, stem, seed, (size[0], size[1]), photo_key, odd))
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            paths = list(pool.map(_write_imagenet_like, jobs, chunksize=64))
    else:
        paths = [_write_imagenet_like(job) for job in jobs]
    return paths  # class-major, zero-padded names: already ImageFolder's sorted order


# --------------------------------------------------------------------------- indexed


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


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m sample_data.generate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    inet = sub.add_parser("imagenet-like", help="ImageNet-like JPEG ImageFolder tree")
    idx = sub.add_parser("indexed", help="tiny flat-colour tree whose pixels encode the index")
    for p, classes, per_class in ((inet, 10, 100), (idx, 3, 5)):
        p.add_argument("out", type=Path)
        p.add_argument("--classes", type=int, default=classes)
        p.add_argument("--per-class", type=int, default=per_class)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--size", type=int, nargs=2, metavar=("W", "H"))
    inet.add_argument("--workers", type=int, default=0)
    inet.add_argument("--odd", choices=("default", "imagenet"), default="default",
                      help="shares of PNG, CMYK and grayscale files: about 1%%, 1%% and 2%% (default), or "
                           "ImageNet-1k's own (1 PNG and 22 CMYK JPEGs in 1,281,167 files; grayscale 2%%)")
    idx.add_argument("--ext", default="jpg")
    args = parser.parse_args(argv)
    common: dict[str, Any] = {
        "classes": args.classes, "per_class": args.per_class, "seed": args.seed,
    }
    if args.size:
        common["size"] = tuple(args.size)
    try:
        if args.command == "imagenet-like":
            odd = IMAGENET_ODD_FILES if args.odd == "imagenet" else OddFiles()
            paths = make_imagenet_like(args.out, workers=args.workers, odd=odd, **common)
        else:
            paths = make_indexed_imagefolder(args.out, ext=args.ext, **common)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} images ({total / 1e6:.1f} MB) under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
