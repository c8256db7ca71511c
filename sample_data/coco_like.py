"""A seeded generator of COCO-like detection sets at benchmark scale (no network, no skimage).

:func:`make_coco_like` writes ``ROOT/images/...`` and ``ROOT/instances.json``: the images are
:func:`sample_data.generate.make_imagenet_like`'s (photo crops with jitter, about 2% grayscale, 1%
CMYK, 1% PNG), in 10 class folders; each image gets 1 to ``max_boxes`` boxes of random categories
(1..``categories``) placed inside it. Annotations carry ``bbox``, ``area``, ``iscrowd`` and no
segmentation (loaders are measured without masks). Byte-reproducible for a given seed (and
Pillow/libjpeg version), whatever the number of worker processes. For the awkward cases of the
COCO format (polygons, RLE, keypoints, missing files) use :mod:`sample_data.coco_gen` instead.

CLI, from the repository root::

    python -m sample_data.coco_like /tmp/coco --images 1000 --size 560 480 --workers 2
    shardkit bench /tmp/coco/images --annotations /tmp/coco/instances.json --workers 2 --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from sample_data.generate import make_imagenet_like

#: Class folders the images are spread over (ImageFolder layout under ``images/``).
FOLDERS = 10


def make_coco_like(root: Path, *, images: int = 1000, size: tuple[int, int] = (560, 480), max_boxes: int = 15,
                   categories: int = 20, seed: int = 0, workers: int = 0) -> tuple[Path, Path]:
    """Write ``images`` images under ``root/images/`` and their boxes to ``root/instances.json``;
    return both paths. ``size`` is the nominal (width, height), ±15% per side."""
    if images < 1 or max_boxes < 1 or categories < 1:
        raise ValueError("images, max_boxes and categories must be at least 1")
    per_class = -(-images // FOLDERS)  # enough for ``images``: the first ``images`` in ImageFolder order are kept
    paths = make_imagenet_like(root / "images", classes=FOLDERS, per_class=per_class, seed=seed, size=size,
                               workers=workers)
    for extra in paths[images:]:
        extra.unlink()
        if not any(extra.parent.iterdir()):
            extra.parent.rmdir()
    rng = random.Random(seed)
    records: list[dict[str, object]] = []
    anns: list[dict[str, object]] = []
    for i, path in enumerate(paths[:images]):
        with Image.open(path) as im:
            width, height = im.size
        records.append({"id": i + 1, "file_name": str(path.relative_to(root / "images")), "width": width,
                        "height": height})
        for _ in range(rng.randint(1, max_boxes)):
            w, h = rng.uniform(8, width * 0.6), rng.uniform(8, height * 0.6)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": rng.randint(1, categories),
                         "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                         "area": round(w * h, 2), "iscrowd": 0})
    doc = {"images": records, "annotations": anns,
           "categories": [{"id": c, "name": f"class{c}"} for c in range(1, categories + 1)]}
    out = root / "instances.json"
    out.write_text(json.dumps(doc))
    return root / "images", out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m sample_data.coco_like", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="output folder (images/ and instances.json)")
    ap.add_argument("--images", type=int, default=1000, help="number of images")
    ap.add_argument("--size", type=int, nargs=2, default=(560, 480), metavar=("W", "H"),
                    help="nominal image size (±15%% per side)")
    ap.add_argument("--max-boxes", type=int, default=15, help="boxes per image: 1 to this")
    ap.add_argument("--categories", type=int, default=20, help="category ids 1..N")
    ap.add_argument("--seed", type=int, default=0, help="seed of images and boxes")
    ap.add_argument("--workers", type=int, default=0, help="processes drawing the images")
    args = ap.parse_args(argv)
    images, ann = make_coco_like(args.root, images=args.images, size=(args.size[0], args.size[1]),
                                 max_boxes=args.max_boxes, categories=args.categories, seed=args.seed,
                                 workers=args.workers)
    print(f"wrote {images} and {ann}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
