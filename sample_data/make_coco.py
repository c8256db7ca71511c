"""Rebuild ``sample_data/coco/`` (real photos + hand-checked COCO annotations), deterministically.

The objects were outlined by hand on the photos in ``sample_data/photos/`` (polygons, or
ellipses for round things) and checked by drawing them over the photos. Everything else is
derived: each annotation's ``bbox`` is the tight box of its outline and ``area`` the pixel
area of its mask (pycocotools), like in COCO. Crops and flips of the photos carry the outlines
clipped (Sutherland-Hodgman) and mirrored; an object keeps its annotation in a crop when at
least :data:`KEEP` of its area stays visible. The bottom row of coins is one crowd annotation
(``iscrowd: 1``, uncompressed RLE as in COCO).

Usage, from the repository root::

    .venv/bin/python -m sample_data.make_coco     # rewrites sample_data/coco/

Output is byte-identical for the same Pillow/libjpeg versions. Needs pycocotools.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from sample_data.coco_annotations import CATEGORIES, CROPS, OBJECTS, PHOTOS, Poly

HERE = Path(__file__).resolve().parent
OUT = HERE / "coco"
KEEP = 0.3
QUALITY = 85


def _clip(poly: Poly, x0: float, y0: float, x1: float, y1: float) -> Poly:
    """Sutherland-Hodgman clipping of ``poly`` to the rectangle [x0, x1] x [y0, y1]."""
    edges = [(0, x0, 1), (0, x1, -1), (1, y0, 1), (1, y1, -1)]  # (axis, bound, inside sign)
    for axis, bound, sign in edges:
        out: Poly = []
        for i, cur in enumerate(poly):
            prev = poly[i - 1]
            cur_in, prev_in = (cur[axis] - bound) * sign >= 0, (prev[axis] - bound) * sign >= 0
            if cur_in != prev_in:
                t = (bound - prev[axis]) / (cur[axis] - prev[axis])
                out.append((prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])))
            if cur_in:
                out.append(cur)
        poly = out
        if not poly:
            break
    return poly


def _mask_area(segmentation: list[list[float]] | np.ndarray, height: int, width: int) -> float:
    from pycocotools import mask as mask_utils

    if isinstance(segmentation, np.ndarray):
        return float(segmentation.sum())
    rles = mask_utils.frPyObjects(segmentation, height, width)
    return float(mask_utils.area(mask_utils.merge(rles)))


def _polygons_mask(polys: list[Poly], height: int, width: int) -> np.ndarray:
    from pycocotools import mask as mask_utils

    flat = [[round(v, 2) for p in poly for v in p] for poly in polys]
    rle = mask_utils.merge(mask_utils.frPyObjects(flat, height, width))
    return mask_utils.decode(rle).astype(bool)


def _uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE: run lengths over the column-major pixels, starting with zeros."""
    flat = np.asarray(mask, dtype=np.uint8).flatten(order="F")
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    counts = np.diff(np.concatenate([[0], changes])).tolist()
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(c) for c in counts]}


def _box(xs: list[float], ys: list[float]) -> list[float]:
    return [round(min(xs), 2), round(min(ys), 2), round(max(xs) - min(xs), 2),
            round(max(ys) - min(ys), 2)]


def _view(obj: dict[str, Any], crop: tuple[int, int, int, int], flip: bool,
          size: tuple[int, int]) -> dict[str, Any] | None:
    """The object as seen in ``crop`` (x0, y0, x1, y1) of its photo, mirrored when ``flip``."""
    x0, y0, x1, y1 = crop
    width, height = x1 - x0, y1 - y0
    if obj.get("crowd"):
        mask = np.zeros(size[::-1], dtype=bool)
        for poly in obj["polygons"]:
            mask |= _polygons_mask([poly], size[1], size[0])
        full = mask.sum()
        mask = mask[y0:y1, x0:x1][:, ::-1] if flip else mask[y0:y1, x0:x1]
        if mask.sum() < KEEP * full:
            return None
        ys, xs = np.nonzero(mask)
        bbox = _box([float(xs.min()), float(xs.max() + 1)], [float(ys.min()), float(ys.max() + 1)])
        return {"iscrowd": 1, "segmentation": _uncompressed_rle(mask), "bbox": bbox,
                "area": float(mask.sum())}
    polys = []
    for poly in obj["polygons"]:
        clipped = _clip(poly, x0, y0, x1, y1)
        if len(clipped) >= 3:
            pts = [(x - x0, y - y0) for x, y in clipped]
            polys.append([(width - x, y) for x, y in pts] if flip else pts)
    if not polys:
        return None
    segmentation = [[round(v, 2) for p in poly for v in p] for poly in polys]
    area = _mask_area(segmentation, height, width)
    original = _mask_area([[round(v, 2) for p in poly for v in p] for poly in obj["polygons"]],
                          size[1], size[0])
    if area < KEEP * original:
        return None
    bbox = _box([x for poly in polys for x, _ in poly], [y for poly in polys for _, y in poly])
    return {"iscrowd": 0, "segmentation": segmentation, "bbox": bbox, "area": area}


def build(out: Path = OUT) -> Path:
    """Write ``out/images/...`` and ``out/instances.json``; return the JSON's path."""
    if (out / "images").exists():
        shutil.rmtree(out / "images")  # README.md beside it stays
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    views: list[tuple[str, str, tuple[int, int, int, int] | None, bool]]
    views = [(name, rel, None, False) for name, rel in PHOTOS.items()]
    views += [(name, rel, box, flip) for name, rel, box, flip in CROPS]
    for image_id, (name, rel, crop, flip) in enumerate(views, start=1):
        photo = Image.open(HERE / "photos" / f"{name}.jpg")
        box = crop or (0, 0, photo.width, photo.height)
        img = photo.crop(box)
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        path = out / "images" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path, "JPEG", quality=QUALITY)
        images.append({"id": image_id, "file_name": rel, "width": img.width, "height": img.height,
                       "license": 1, "date_captured": "", "source_photo": f"{name}.jpg"})
        for obj in OBJECTS.get(name, []):
            seen = _view(obj, box, flip, photo.size)
            if seen is not None:
                annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                    "category_id": obj["category_id"], **seen})
    doc = {
        "info": {"description": "shardkit COCO sample: scikit-image photos, hand-made annotations",
                 "version": "1.0", "year": 2026, "contributor": "shardkit",
                 "url": "https://github.com/scikit-image/scikit-image/tree/main/skimage/data"},
        "licenses": [{"id": 1, "name": "Public domain / CC0 (see sample_data/README.md)",
                      "url": ""}],
        "images": images,
        "annotations": annotations,
        "categories": CATEGORIES,
    }
    ann_path = out / "instances.json"
    ann_path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return ann_path


if __name__ == "__main__":
    print(build())
