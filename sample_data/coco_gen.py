"""A seeded generator of small COCO detection datasets covering the awkward cases (no network).

:func:`make_coco` writes ``ROOT/images/...`` and ``ROOT/instances.json`` with: polygons (one and
several parts), a crowd annotation with uncompressed RLE and one with compressed (string) RLE,
keypoints and extra non-standard fields, float boxes, images without annotations,
non-contiguous category ids, a unicode (NFC) file name, images in sub-folders, JPEG and PNG,
and ``info``/``licenses``. Every image's pixels are a flat colour plus a bright rectangle at its
first box, so a mix-up between images is visible. Tests derive the broken variants (bad
references, missing files, malformed JSON) from this valid base.

CLI, from the repository root::

    python -m sample_data.coco_gen OUT --images 12 --seed 0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

#: Non-contiguous ids, as in COCO (1..90 with gaps).
CATEGORIES = [
    {"id": 1, "name": "person", "supercategory": "person",
     "keypoints": ["nose", "left_eye", "right_eye"], "skeleton": [[1, 2], [1, 3]]},
    {"id": 3, "name": "car", "supercategory": "vehicle"},
    {"id": 18, "name": "dog", "supercategory": "animal"},
    {"id": 90, "name": "toothbrush", "supercategory": "indoor"},
]


def _file_name(i: int) -> str:
    if i == 1:
        return "sub/dir/deep_0001.jpg"
    if i == 2:
        return "café_ü_0002.jpg"  # NFC
    if i % 5 == 4:
        return f"png/img_{i:04d}.png"
    return f"img_{i:04d}.jpg"


def _annotations(rng: np.random.Generator, image_id: int, width: int, height: int,
                 count: int, next_id: int) -> list[dict[str, Any]]:
    anns = []
    for k in range(count):
        w = float(round(rng.uniform(8, width / 2), 2))
        h = float(round(rng.uniform(8, height / 2), 2))
        x = float(round(rng.uniform(0, width - w), 2))
        y = float(round(rng.uniform(0, height - h), 2))
        ann: dict[str, Any] = {"id": next_id + k, "image_id": image_id,
                               "category_id": CATEGORIES[int(rng.integers(len(CATEGORIES)))]["id"],
                               "bbox": [x, y, w, h], "area": round(w * h * 0.8, 3), "iscrowd": 0}
        quad = [x, y, x + w, y, x + w, y + h, x, y + h]
        ann["segmentation"] = ([quad] if k % 2 == 0
                               else [quad[:6], [x, y, x + w / 2, y + h, x, y + h]])
        if ann["category_id"] == 1:
            ann["keypoints"] = [round(x + w / 2, 1), round(y + h / 4, 1), 2, 0, 0, 0,
                                round(x + w / 3, 1), round(y + h / 5, 1), 1]
            ann["num_keypoints"] = 2
        if k == 1:
            ann["attributes"] = {"occluded": True, "note": "ünïcode"}
        anns.append(ann)
    return anns


def _crowd(image_id: int, ann_id: int, width: int, height: int, compressed: bool) -> dict[str, Any]:
    x0, y0, w, h = width // 4, height // 4, width // 2, height // 3
    if compressed:
        from pycocotools import mask as mask_utils  # only for the compressed-RLE case

        m = np.zeros((height, width), dtype=np.uint8, order="F")
        m[y0:y0 + h, x0:x0 + w] = 1
        rle = mask_utils.encode(m)
        segmentation: dict[str, Any] = {"size": [height, width],
                                        "counts": rle["counts"].decode("ascii")}
    else:
        counts, pos = [], 0  # column-major runs: zeros, ones, zeros, ...
        for col in range(width):
            if x0 <= col < x0 + w:
                start = col * height
                counts += [start + y0 - pos, h]
                pos = start + y0 + h
        counts.append(width * height - pos)
        segmentation = {"size": [height, width], "counts": counts}
    return {"id": ann_id, "image_id": image_id, "category_id": 1, "iscrowd": 1,
            "segmentation": segmentation, "bbox": [float(x0), float(y0), float(w), float(h)],
            "area": float(w * h)}


def make_coco(root: str | Path, *, images: int = 12, seed: int = 0) -> tuple[Path, Path]:
    """Write a valid COCO dataset under ``root``; return ``(images_dir, instances_json)``.

    Image ids are ``100 + 7*i`` listed in reverse order (so file order != id order); every
    third image (``i % 3 == 2``) has no annotations; image 0 has an uncompressed crowd RLE,
    image 3 a compressed one. Byte-reproducible for a given seed.
    """
    if images < 5:
        raise ValueError("images must be >= 5 to cover every case")
    root = Path(root)
    images_dir = root / "images"
    rng = np.random.default_rng([seed, 0xC0C0])
    image_records: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i in range(images):
        width, height = int(rng.integers(48, 120)), int(rng.integers(40, 100))
        image_id = 100 + 7 * i
        record: dict[str, Any] = {"id": image_id, "file_name": _file_name(i), "width": width,
                                  "height": height,
                  "license": 1 + i % 2, "date_captured": "2024-01-01 00:00:00", "coco_url": ""}
        image_records.append(record)
        count = 0 if i % 3 == 2 else 1 + int(rng.integers(3))
        anns = _annotations(rng, image_id, width, height, count, 1000 + 10 * i)
        if i in (0, 3):
            anns.append(_crowd(image_id, 1000 + 10 * i + 9, width, height, compressed=i == 3))
        annotations += anns
        pixels = np.full((height, width, 3), rng.integers(0, 200, 3), dtype=np.uint8)
        if anns:
            x, y, w, h = (int(v) for v in anns[0]["bbox"])
            pixels[y:y + h, x:x + w] = 255
        path = images_dir / record["file_name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(pixels)
        if path.suffix == ".png":
            img.save(path, "PNG")
        else:
            img.save(path, "JPEG", quality=90)
    doc = {
        "info": {"description": "shardkit generated COCO sample", "version": "1.0", "year": 2024},
        "licenses": [{"id": 1, "name": "CC0", "url": ""},
                     {"id": 2, "name": "Public domain", "url": ""}],
        "images": image_records[::-1],
        "annotations": annotations,
        "categories": CATEGORIES,
    }
    ann_path = root / "instances.json"
    ann_path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return images_dir, ann_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    images_dir, ann = make_coco(args.out, images=args.images, seed=args.seed)
    print(images_dir, ann)


if __name__ == "__main__":
    main()
