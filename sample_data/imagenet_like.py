"""The ImageNet-like generator: realistic JPEGs (~400x350 px, ~50-100 KB, q75-95, a few
grayscale/CMYK/PNG files: :class:`OddFiles`) cut from the real photos shipped in
``sample_data/photos/``, for throughput benchmarks and pack/load round-trips at scale.
Byte-reproducible for a given seed (and Pillow/libjpeg version), whatever the number of worker
processes. The CLI is :mod:`sample_data.generate`."""

from __future__ import annotations

import functools
import io
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops

PHOTO_DIR = Path(__file__).resolve().parent / "photos"


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
