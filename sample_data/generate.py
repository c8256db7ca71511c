"""Seeded generators of ImageFolder trees for tests and benchmarks (no network, no skimage).

Two generators, both byte-reproducible for a given seed (and Pillow/libjpeg version), whatever
the number of worker processes:

* :func:`make_imagenet_like` (:mod:`sample_data.imagenet_like`) — realistic JPEGs (~400x350 px,
  ~50-100 KB, q75-95, a few grayscale/CMYK/PNG files) cut from the real photos shipped in
  ``sample_data/photos/``. For throughput benchmarks and pack/load round-trips at scale.
* :func:`make_indexed_imagefolder` (:mod:`sample_data.indexed`) — tiny flat-colour images whose
  colour encodes each image's global index in ImageFolder order; :func:`decode_index` recovers it
  from a decoded image even after JPEG, crop, resize and flip. For checking sample order in loader
  tests.

This module is their command line and re-exports their public names. COCO detection sets come
from ``python -m sample_data.coco_gen`` (small, the format's awkward cases) and
``python -m sample_data.coco_like`` (benchmark scale).

CLI, from the repository root::

    python -m sample_data.generate imagenet-like OUT --classes 10 --per-class 100 --seed 0 \\
        --workers 2
    python -m sample_data.generate indexed OUT --classes 3 --per-class 5 --ext jpg
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sample_data.imagenet_like import (
    IMAGENET_ODD_FILES,
    PHOTO_DIR,
    OddFiles,
    imagenet_class_name,
    make_imagenet_like,
)
from sample_data.indexed import (
    LEVELS,
    MAX_INDEXED,
    STEP,
    decode_index,
    index_color,
    indexed_class_name,
    make_indexed_imagefolder,
)

__all__ = ["IMAGENET_ODD_FILES", "LEVELS", "MAX_INDEXED", "PHOTO_DIR", "STEP", "OddFiles", "decode_index",
           "imagenet_class_name", "index_color", "indexed_class_name", "main", "make_imagenet_like",
           "make_indexed_imagefolder"]


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
