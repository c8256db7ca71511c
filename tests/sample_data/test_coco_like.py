"""sample_data/coco_like.py: COCO-like detection sets at benchmark scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from sample_data import coco_like
from shardkit.sources import scan_coco


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_image_annotated_with_boxes_inside_it(tmp_path: Path) -> None:
    images, ann = coco_like.make_coco_like(tmp_path, images=13, size=(64, 48), max_boxes=3, categories=4)
    doc = json.loads(ann.read_text())
    files = sorted(str(p.relative_to(images)) for p in images.rglob("*") if p.is_file())
    assert sorted(r["file_name"] for r in doc["images"]) == files and len(files) == 13
    assert [c["id"] for c in doc["categories"]] == [1, 2, 3, 4]
    per_image = {r["id"]: 0 for r in doc["images"]}
    for a in doc["annotations"]:
        per_image[a["image_id"]] += 1
        record = doc["images"][a["image_id"] - 1]
        x, y, w, h = a["bbox"]
        assert min(x, y) >= 0 and x + w <= record["width"] + 0.01 and y + h <= record["height"] + 0.01
        assert 1 <= a["category_id"] <= 4 and a["iscrowd"] == 0 and a["area"] == pytest.approx(w * h, rel=1e-3)
    assert all(1 <= n <= 3 for n in per_image.values())
    for r in doc["images"]:
        with Image.open(images / r["file_name"]) as im:
            assert im.size == (r["width"], r["height"])


def test_seeded_byte_identical_and_readable_as_coco(tmp_path: Path) -> None:
    coco_like.make_coco_like(tmp_path / "a", images=10, size=(64, 48), seed=3)
    coco_like.make_coco_like(tmp_path / "b", images=10, size=(64, 48), seed=3, workers=2)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    coco_like.make_coco_like(tmp_path / "c", images=10, size=(64, 48), seed=4)
    assert _tree(tmp_path / "a") != _tree(tmp_path / "c")
    listing = scan_coco(str(tmp_path / "a" / "images"), str(tmp_path / "a" / "instances.json"))
    assert len(listing.samples) == 10


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert coco_like.main([str(tmp_path), "--images", "2", "--size", "40", "30", "--max-boxes", "1"]) == 0
    assert len(json.loads((tmp_path / "instances.json").read_text())["annotations"]) == 2
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(ValueError):
        coco_like.make_coco_like(tmp_path, images=0)
