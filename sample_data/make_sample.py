"""Rebuild the shipped sample data from scikit-image's bundled photos (seeded, reproducible).

This is a one-time maintenance script, not part of the library: it is the only file here that
needs scikit-image (``pip install scikit-image``), and only to locate the original photos that
its wheel ships under ``skimage/data``. Nothing else in ``sample_data/`` imports skimage.

It writes two things (replacing them):

* ``sample_data/photos/<name>.jpg``: each source photo, long side scaled to
  :data:`PHOTO_LONG_SIDE` px, JPEG q90. :mod:`sample_data.generate` builds from these.
* ``sample_data/imagefolder/<class>/<file>``: about 300 small crops (96-200 px long side,
  JPEG q70-95, random flips), one class per source photo, plus the odd cases a loader must
  handle: grayscale and CMYK JPEGs, RGB/RGBA/palette PNGs, an upper-case ``.JPEG`` extension
  and a non-ASCII (NFC) file name.

Usage, from the repository root::

    .venv/bin/python -m sample_data.make_sample          # seed 0, as committed

The output is byte-identical for the same seed, Pillow and libjpeg versions.
"""

from __future__ import annotations

import argparse
import shutil
import unicodedata
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
PHOTO_LONG_SIDE = 512
PER_CLASS = 30

#: class name -> file name under ``skimage/data`` (all with stated free licences; see README).
SOURCES: dict[str, str] = {
    "astronaut": "astronaut.png",
    "brick": "brick.png",
    "camera": "camera.png",
    "chelsea": "chelsea.png",
    "coffee": "coffee.png",
    "coins": "coins.png",
    "hubble": "hubble_deep_field.jpg",
    "ihc": "ihc.png",
    "retina": "retina.jpg",
    "rocket": "rocket.jpg",
}


def skimage_data_dir() -> Path:
    """Return the folder of photos shipped in the installed scikit-image wheel.

    Raises:
        ModuleNotFoundError: scikit-image is not installed.
    """
    import skimage  # maintenance-only dependency, imported lazily

    return Path(skimage.__file__).resolve().parent / "data"


def write_photos(src_dir: Path, out_dir: Path) -> list[Path]:
    """Write each source photo, long side :data:`PHOTO_LONG_SIDE`, as ``<class>.jpg`` (q90)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    paths = []
    for name, fname in SOURCES.items():
        with Image.open(src_dir / fname) as opened:
            im = opened.convert("RGB") if opened.mode not in ("RGB", "L") else opened.copy()
        scale = PHOTO_LONG_SIDE / max(im.size)
        if scale < 1:
            size = (round(im.width * scale), round(im.height * scale))
            im = im.resize(size, Image.Resampling.LANCZOS)
        path = out_dir / f"{name}.jpg"
        im.save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


def _crop(im: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A random area/aspect crop of ``im``, resized to a 96-200 px long side, maybe flipped."""
    area = im.width * im.height * rng.uniform(0.1, 1.0)
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    w = min(im.width, round((area * aspect) ** 0.5))
    h = min(im.height, round((area / aspect) ** 0.5))
    x = int(rng.integers(0, im.width - w + 1))
    y = int(rng.integers(0, im.height - h + 1))
    long_side = int(rng.integers(96, 201))
    scale = long_side / max(w, h)
    size = (max(8, round(w * scale)), max(8, round(h * scale)))
    out = im.resize(size, Image.Resampling.LANCZOS, box=(x, y, x + w, y + h))
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return out


def _special_case(cls_idx: int, j: int) -> str | None:
    """Which odd case (if any) image ``j`` of class ``cls_idx`` is; spread over classes."""
    cases = {
        (0, 3): "gray", (3, 7): "gray", (5, 11): "gray", (7, 2): "gray",
        (1, 5): "cmyk", (4, 9): "cmyk", (8, 13): "cmyk",
        (2, 4): "png_rgb", (6, 6): "png_rgb", (3, 12): "png_rgba", (9, 8): "png_rgba",
        (5, 1): "png_palette", (7, 10): "png_palette",
        (6, 14): "upper_jpeg", (4, 15): "unicode",
    }
    return cases.get((cls_idx, j))


def write_imagefolder(photo_dir: Path, out_dir: Path, *, seed: int = 0) -> list[Path]:
    """Cut :data:`PER_CLASS` crops per source photo into ``out_dir/<class>/`` (seeded)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    paths = []
    for cls_idx, (name, fname) in enumerate(SOURCES.items()):
        with Image.open(photo_dir / fname) as opened:
            opened.load()
        # Gray sources become RGB so that only the listed special cases are 1-channel files.
        src = opened.convert("RGB")
        (out_dir / name).mkdir(parents=True)
        for j in range(PER_CLASS):
            rng = np.random.default_rng([seed, cls_idx, j])
            im = _crop(src, rng)
            quality = int(rng.integers(70, 96))
            case = _special_case(cls_idx, j)
            stem = out_dir / name / f"{name}_{j:03d}"
            if case == "gray":
                path, im = stem.with_suffix(".jpg"), im.convert("L")
            elif case == "cmyk":
                path, im = stem.with_suffix(".jpg"), im.convert("RGB").convert("CMYK")
            elif case == "png_rgb":
                path, im = stem.with_suffix(".png"), im.convert("RGB")
            elif case == "png_rgba":
                path, im = stem.with_suffix(".png"), _with_alpha(im.convert("RGB"))
            elif case == "png_palette":
                path, im = stem.with_suffix(".png"), im.convert("RGB").quantize(64)
            elif case == "upper_jpeg":
                path = stem.with_suffix(".JPEG")
            elif case == "unicode":
                path = out_dir / name / unicodedata.normalize("NFC", "café_crème_ü.jpg")
            else:
                path = stem.with_suffix(".jpg")
            if path.suffix == ".png":
                im.save(path, "PNG", optimize=True)
            else:
                im.save(path, "JPEG", quality=quality)
            paths.append(path)
    return paths


def _with_alpha(im: Image.Image) -> Image.Image:
    """``im`` with a horizontal alpha ramp (opaque left, 25% opaque right)."""
    ramp = np.linspace(255, 64, im.width).astype(np.uint8)
    alpha = Image.fromarray(np.broadcast_to(ramp, (im.height, im.width)).copy(), "L")
    out = im.copy()
    out.putalpha(alpha)
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI: rebuild ``photos/`` from skimage, then ``imagefolder/`` from the originals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    src_dir = skimage_data_dir()
    photos = write_photos(src_dir, args.out / "photos")
    files = write_imagefolder(src_dir, args.out / "imagefolder", seed=args.seed)
    print(f"wrote {len(photos)} photos and {len(files)} ImageFolder files under {args.out}")


if __name__ == "__main__":
    main()
