"""The shipped COCO sample (sample_data/coco): well-formed, reproducible, packs exactly."""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sample_data import make_coco
from shardkit.format.tarread import iter_samples
from shardkit.index.verify import verify_dataset
from shardkit.pack import PackOptions, pack_coco
from shardkit.sources import scan_coco

ROOT = Path(make_coco.OUT)
IMAGES, ANNOTATIONS = ROOT / "images", ROOT / "instances.json"


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(ANNOTATIONS.read_text(encoding="utf-8"))


def test_sample_covers_the_awkward_cases(doc: dict) -> None:
    listing = scan_coco(str(IMAGES), str(ANNOTATIONS))
    assert listing.warnings == [] and len(listing.samples) == len(doc["images"]) == 25
    assert all(s.size > 0 for s in listing.samples)
    ids = [c["id"] for c in doc["categories"]]
    assert ids != list(range(1, len(ids) + 1))  # non-contiguous
    assert sum(a["iscrowd"] for a in doc["annotations"]) >= 1
    assert all(isinstance(a["segmentation"], dict) == bool(a["iscrowd"])
               for a in doc["annotations"])
    names = [im["file_name"] for im in doc["images"]]
    assert any("/" in n for n in names) and any(not n.isascii() for n in names)
    assert all(unicodedata.is_normalized("NFC", n) for n in names)
    assert sum(1 for s in listing.samples if s.meta and not s.meta["annotations"]) == 2
    assert ANNOTATIONS.stat().st_size + sum(p.stat().st_size for p in IMAGES.rglob("*")) < 1_500_000


def test_boxes_are_tight_around_the_masks(doc: dict) -> None:
    from pycocotools import mask as mask_utils

    sizes = {im["id"]: (im["height"], im["width"]) for im in doc["images"]}
    for ann in doc["annotations"]:
        h, w = sizes[ann["image_id"]]
        rle = mask_utils.frPyObjects(ann["segmentation"], h, w)
        if not ann["iscrowd"]:
            rle = mask_utils.merge(rle)
        x, y, bw, bh = ann["bbox"]
        mx, my, mw, mh = mask_utils.toBbox(rle).tolist()
        assert x >= 0 and y >= 0 and x + bw <= w and y + bh <= h
        assert (abs(mx - x) <= 1.5 and abs(my - y) <= 1.5 and abs(mw - bw) <= 2
                and abs(mh - bh) <= 2), ann["id"]
        assert ann["area"] == pytest.approx(float(mask_utils.area(rle)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pycocotools vs numpy 2
def test_rebuild_reproduces_the_annotations(tmp_path: Path) -> None:
    rebuilt = make_coco.build(tmp_path / "coco")
    assert rebuilt.read_bytes() == ANNOTATIONS.read_bytes()
    out = tmp_path / "coco"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.jpg")) == \
        sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.jpg"))


def test_packed_sample_equals_records_and_coco_detection(doc: dict, tmp_path: Path) -> None:
    from torchvision.datasets import CocoDetection

    dst = tmp_path / "out"
    result = pack_coco(str(IMAGES), str(ANNOTATIONS), str(dst), options=PackOptions(max_count=8),
                       workers=2)
    assert result.manifest.num_samples == 25 and result.manifest.skipped == ()
    assert verify_dataset(str(dst), decode=True).ok
    packed = {}
    for shard in sorted(dst.glob("*.tar")):
        with open(shard, "rb") as f:
            for key, fields in iter_samples(f, where=str(shard)):
                packed[int(key)] = (json.loads(fields["json"]), fields["jpg"])
    reference = CocoDetection(str(IMAGES), str(ANNOTATIONS))
    for index in range(len(reference)):
        meta, data = packed[index]
        image, target = reference[index]
        record = reference.coco.loadImgs(reference.ids[index])[0]
        assert meta == {"image": record, "annotations": target, "source": record["file_name"]}
        assert data == (IMAGES / record["file_name"]).read_bytes()
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")),
                              np.asarray(image))
