"""Write a COCO-like detection set for benchmarks: ImageNet-like JPEGs with random boxes.

``sample_data.generate.make_imagenet_like`` draws the images (photo crops with jitter, about 2%
grayscale, 1% CMYK, 1% PNG); each image gets 1 to ``--max-boxes`` boxes of random categories
(1..``--categories``) placed inside it. Annotations carry ``bbox``, ``area``, ``iscrowd`` and no
segmentation (loaders are measured without masks). Seeded: the same arguments give the same set.

Usage::

    python benchmarks/make_coco_like.py /tmp/coco --images 1000 --size 560 480
    shardkit bench /tmp/coco/images --annotations /tmp/coco/instances.json --workers 2 --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # sample_data, from the repository root

from sample_data.generate import make_imagenet_like  # noqa: E402


def make_coco_like(root: Path, *, images: int, size: tuple[int, int], max_boxes: int, categories: int,
                   seed: int, workers: int) -> tuple[Path, Path]:
    """Write ``root/images/...`` and ``root/instances.json``; return both paths."""
    per_class = max(1, images // 10)
    paths = make_imagenet_like(root / "images", classes=10, per_class=per_class, seed=seed, size=size,
                               workers=workers)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="output folder (images/ and instances.json)")
    ap.add_argument("--images", type=int, default=1000, help="number of images")
    ap.add_argument("--size", type=int, nargs=2, default=(560, 480), metavar=("W", "H"),
                    help="nominal image size (±15%% per side)")
    ap.add_argument("--max-boxes", type=int, default=15, help="boxes per image: 1 to this")
    ap.add_argument("--categories", type=int, default=20, help="category ids 1..N")
    ap.add_argument("--seed", type=int, default=0, help="seed of images and boxes")
    ap.add_argument("--workers", type=int, default=0, help="processes drawing the images")
    args = ap.parse_args()
    images, ann = make_coco_like(args.root, images=args.images, size=tuple(args.size), max_boxes=args.max_boxes,
                                 categories=args.categories, seed=args.seed, workers=args.workers)
    print(f"wrote {images} and {ann}")


if __name__ == "__main__":
    main()
