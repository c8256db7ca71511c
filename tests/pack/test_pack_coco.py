"""pack_coco / ``shardkit pack --annotations``: records packed exactly, readable by webdataset,
equal to torchvision's CocoDetection, byte-reproducible, bad input reported."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from sample_data.coco_gen import make_coco
from shardkit.cli import cli
from shardkit.index.manifest_io import read_manifest
from shardkit.index.verify import verify_dataset
from shardkit.pack import PackOptions, pack_coco
from shardkit.storage import Store

OPTIONS = PackOptions(max_count=4)


@pytest.fixture
def coco(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    images_dir, ann = make_coco(tmp_path / "coco", images=14)
    return images_dir, ann, json.loads(ann.read_text(encoding="utf-8"))


def _read_webdataset(dst: Path) -> dict[str, dict[str, Any]]:
    """Every sample of the dataset, read with plain webdataset (no shardkit code)."""
    import webdataset as wds

    urls = sorted(str(p) for p in dst.glob("*.tar"))
    return {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)}


def test_packed_json_equals_input_records(coco: tuple[Path, Path, dict[str, Any]],
                                          tmp_path: Path) -> None:
    images_dir, ann, doc = coco
    dst = tmp_path / "out"
    result = pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=1)
    samples = _read_webdataset(dst)
    assert len(samples) == len(doc["images"]) == result.manifest.num_samples
    packed = {}
    for key, s in samples.items():
        assert "." not in key and "cls" not in s
        meta = json.loads(s["json"])
        assert set(meta) == {"image", "annotations", "source"}
        image_ext = next(e for e in s if e in ("jpg", "png"))
        assert s[image_ext] == (images_dir / meta["source"]).read_bytes()
        packed[meta["image"]["id"]] = meta
    for image in doc["images"]:
        anns = [a for a in doc["annotations"] if a["image_id"] == image["id"]]
        assert (packed[image["id"]]
                == {"image": image, "annotations": anns, "source": image["file_name"]})
    manifest = read_manifest(Store(str(dst)))
    assert manifest.kind == "coco" and list(manifest.categories or ()) == doc["categories"]
    assert manifest.extra == {"info": doc["info"], "licenses": doc["licenses"],
                              "annotation_report": manifest.extra["annotation_report"]}
    assert manifest.extra["annotation_report"]["packed"] == len(doc["annotations"])
    assert manifest.classes is None and manifest.skipped == ()
    assert verify_dataset(str(dst), decode=True).ok


def test_matches_torchvision_coco_detection(coco: tuple[Path, Path, dict[str, Any]],
                                            tmp_path: Path) -> None:
    from torchvision.datasets import CocoDetection

    images_dir, ann, _ = coco
    dst = tmp_path / "out"
    pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=1)
    reference = CocoDetection(str(images_dir), str(ann))
    samples = _read_webdataset(dst)
    assert len(samples) == len(reference)
    for index, image_id in enumerate(reference.ids):
        # Sorted by id like CocoDetection, so key i is CocoDetection index i.
        sample = samples[f"{index:08d}"]
        meta = json.loads(sample["json"])
        image, target = reference[index]
        assert meta["image"]["id"] == image_id
        assert meta["annotations"] == target
        data = sample.get("jpg", sample.get("png"))
        assert (data
                == Path(images_dir, reference.coco.loadImgs(image_id)[0]["file_name"]).read_bytes())
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")),
                              np.asarray(image))


def test_byte_reproducible_for_any_worker_count(coco: tuple[Path, Path, dict[str, Any]],
                                                tmp_path: Path) -> None:
    images_dir, ann, _ = coco
    outputs = []
    for workers in (1, 2):
        dst = tmp_path / f"w{workers}"
        pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=workers)
        outputs.append({p.name: p.read_bytes() for p in sorted(dst.iterdir())})
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2 * 4 + 3  # 4 shards, 4 .idx, index.json, .table, .hashes


def test_bad_input_is_reported_and_the_rest_packed(coco: tuple[Path, Path, dict[str, Any]],
                                                   tmp_path: Path) -> None:
    images_dir, ann, doc = coco
    (images_dir / "img_0005.jpg").unlink()
    (images_dir / "img_0006.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    doc["annotations"].append({"id": 77, "image_id": 12345, "category_id": 1, "bbox": [0, 0, 1, 1]})
    doc["annotations"].append({"id": 78, "image_id": 100, "category_id": 4, "bbox": [0, 0, 1, 1]})
    ann.write_text(json.dumps(doc), encoding="utf-8")
    result = pack_coco(str(images_dir), str(ann), str(tmp_path / "out"), options=OPTIONS, workers=2)
    skipped = {s["source"]: s["reason"] for s in result.manifest.skipped}
    assert skipped["img_0005.jpg"].startswith("unreadable file")
    assert "img_0006.jpg" in skipped
    assert len(result.manifest.skipped) == 2  # images only: missing, corrupt
    assert result.manifest.num_samples == len(doc["images"]) - 2
    # The dropped annotations are reported as annotations (in index.json), not as skipped images.
    written = json.loads((tmp_path / "out" / "index.json").read_text())
    report = written["annotation_report"]
    assert report["dropped"] == 2 and report["kept_with_problems"] == 0
    gone = {im["id"] for im in doc["images"] if im["file_name"] in ("img_0005.jpg", "img_0006.jpg")}
    lost = sum(1 for a in doc["annotations"] if a["image_id"] in gone or a["id"] in (77, 78))
    assert (report["in_skipped_images"] + report["packed"] + report["dropped"]
            == len(doc["annotations"]))
    assert report["in_skipped_images"] + report["dropped"] == lost
    assert sorted(p["reason"].split(";")[0] for p in report["problems"]) == [
        "1 annotation(s) have unknown category_id 4", "1 annotation(s) reference unknown image ids"]
    assert verify_dataset(str(tmp_path / "out")).ok
    # ... and survives reading the manifest back (info and re-run summaries show it)
    assert read_manifest(Store(str(tmp_path / "out"))).extra["annotation_report"] == report


def test_a_repeated_image_record_leaves_the_packed_ones_annotations_counted_as_packed(
        coco: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    """The refused repeat named the packed record's file, and that image's annotations were counted
    'in skipped images' while they were packed."""
    images_dir, ann, doc = coco
    doc["images"].append(dict(doc["images"][0]))  # the same record again: id and file_name
    ann.write_text(json.dumps(doc), encoding="utf-8")
    result = pack_coco(str(images_dir), str(ann), str(tmp_path / "out"), options=OPTIONS, workers=1)
    assert [s["reason"].split(":")[1].strip()[:19] for s in result.manifest.skipped] == ["repeated image id ("]
    report = result.manifest.extra["annotation_report"]
    assert report["packed"] == len(doc["annotations"]) and report["in_skipped_images"] == 0


def test_a_repeated_image_id_packs_the_last_record_as_coco_detection(coco: tuple[Path, Path, dict[str, Any]],
                                                                     tmp_path: Path) -> None:
    """The first record of a repeated image id was packed; pycocotools keeps the last, so
    CocoDetection gave another picture with the same boxes. The last is packed now."""
    from torchvision.datasets import CocoDetection

    images_dir, ann, doc = coco
    image_id = doc["images"][5]["id"]
    doc["images"][4]["id"] = image_id
    ann.write_text(json.dumps(doc), encoding="utf-8")
    dst = tmp_path / "out"
    result = pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=1)
    assert [(s["source"], s["reason"]) for s in result.manifest.skipped] == [
        (doc["images"][4]["file_name"], f"images[4]: repeated image id (id {image_id}: its last record, "
                                        "images[5], stands for it, as pycocotools and so CocoDetection keep the last)")]
    reference = CocoDetection(str(images_dir), str(ann))
    samples = _read_webdataset(dst)
    assert len(samples) == len(reference) == len(doc["images"]) - 1
    for index, ref_id in enumerate(reference.ids):
        sample = samples[f"{index:08d}"]
        record = reference.coco.loadImgs(ref_id)[0]
        assert json.loads(sample["json"]) == {"image": record, "annotations": reference._load_target(ref_id),
                                              "source": record["file_name"]}
        assert sample.get("jpg", sample.get("png")) == (images_dir / record["file_name"]).read_bytes()
    assert record is not None and reference.coco.imgs[image_id] is not None
    assert reference.coco.imgs[image_id]["file_name"] == doc["images"][5]["file_name"]


def test_verify_checks_an_rle_against_the_image_even_where_it_fits_a_wrong_record(
        coco: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    """An RLE of the record's wrong size fit the record, so verify said OK where the loader with
    masks=True refuses the image."""
    images_dir, ann, doc = coco
    image = next(im for im in doc["images"] if im["id"] == 100)
    image.update(width=20, height=20)
    rle = next(a for a in doc["annotations"] if a["image_id"] == 100 and isinstance(a.get("segmentation"), dict))
    rle["segmentation"] = {"size": [20, 20], "counts": [0, 400]}
    ann.write_text(json.dumps(doc), encoding="utf-8")
    pack_coco(str(images_dir), str(ann), str(tmp_path / "out"), options=OPTIONS, workers=1)
    report = verify_dataset(str(tmp_path / "out"))
    assert [f.rsplit(": ", 1)[1] for f in report.flagged] == [f"annotation {rle['id']!r}"], report.flagged


def test_a_coco_pack_begun_by_an_earlier_shardkit_writes_its_shards_again_for_the_image_sizes(
        coco: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    """Receipts of an earlier shardkit record no image sizes: resumed from them, the report kept
    the flags made at a wrong record's size and left out the record's own."""
    images_dir, ann, doc = coco
    next(im for im in doc["images"] if im["id"] == 100).update(width=20, height=20)
    ann.write_text(json.dumps(doc), encoding="utf-8")
    fresh = pack_coco(str(images_dir), str(ann), str(tmp_path / "fresh"), options=OPTIONS, workers=1)
    dst, seen = tmp_path / "out", []

    def stop(n: int) -> None:
        seen.append(n)
        if len(seen) == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=1, progress=stop)
    receipts = list((dst / ".shardkit-pack").glob("*.done.json"))
    assert receipts
    for receipt in receipts:  # as an earlier shardkit wrote them
        fields = json.loads(receipt.read_text(encoding="utf-8"))
        del fields["image_sizes"]
        receipt.write_text(json.dumps(fields), encoding="utf-8")
    resumed = pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=1)
    assert resumed.reused_shards == 0
    assert resumed.manifest.extra == fresh.manifest.extra
    assert "the record of image id 100 says 20x20" in json.dumps(resumed.manifest.extra)


def test_an_image_record_of_another_size_is_said_and_its_annotations_checked_at_the_image_size(
        coco: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    """A record saying 20x20 of a larger image had its boxes flagged as outside and its RLE as
    malformed, both false (the loader, as torchvision's v2 wrapper, makes masks at the decoded size),
    and verify warned; a record larger than its image was not reported at all."""
    from shardkit import ShardLoader
    from shardkit.sources import scan_coco

    images_dir, ann, doc = coco
    small = next(im for im in doc["images"] if im["id"] == 100)  # has a crowd RLE of its real size
    big = next(im for im in doc["images"] if im["id"] == 107)
    (w, h), (bw, bh) = (small["width"], small["height"]), (big["width"], big["height"])
    small["width"] = small["height"] = 20
    big["width"], big["height"] = 3 * bw, 3 * bh
    category = doc["categories"][0]["id"]
    doc["annotations"].append({"id": 9001, "image_id": 107, "category_id": category, "bbox": [0, 0, bw + 10, 5],
                               "area": 5.0, "iscrowd": 0,  # inside the record, outside the image
                               "segmentation": [[0, 0, bw + 10, 0, bw + 10, 5, 0, 5]]})
    ann.write_text(json.dumps(doc), encoding="utf-8")
    scanned = [p["reason"] for p in scan_coco(str(images_dir), str(ann)).annotation_problems]
    assert any("outside the 20x20 image" in r for r in scanned) and any("segmentation" in r for r in scanned)

    dst = tmp_path / "out"
    result = pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=2)
    report = result.manifest.extra["annotation_report"]
    said: dict[str, list[str]] = {}
    for p in report["problems"]:
        said.setdefault(p["source"], []).append(p["reason"])
    loader_does = ("; packed as is: the loader takes the image's size (masks are made at {}, as torchvision's "
                   "CocoDetection wrapped for transforms v2 makes them; pycocotools' annToMask would take the "
                   "record's), and its annotations are checked against it")
    assert said == {
        small["file_name"]: [f"the record of image id 100 says 20x20, the image is {w}x{h}"
                             + loader_does.format(f"{w}x{h}")],
        big["file_name"]: [f"the record of image id 107 says {3 * bw}x{3 * bh}, the image is {bw}x{bh}"
                           + loader_does.format(f"{bw}x{bh}"),
                           f"1 annotation bbox(es) extend outside the {bw}x{bh} image; kept as is "
                           "(annotation ids 9001)"]}
    assert (report["kept_with_problems"], report["dropped"]) == (1, 0)
    again = pack_coco(str(images_dir), str(ann), str(tmp_path / "w1"), options=OPTIONS, workers=1)
    assert again.manifest.extra == result.manifest.extra  # whichever worker found the sizes

    checked = CliRunner().invoke(cli, ["verify", str(dst)])
    assert checked.exit_code == 0 and "WARN" not in checked.output, checked.output
    loader = ShardLoader(str(dst), batch_size=4, num_workers=0, on_error="raise", shuffle=False, masks=True)
    shapes = {t["image_id"]: tuple(t["masks"].shape[1:]) for _, targets in loader for t in targets}
    assert len(shapes) == len(doc["images"]) and shapes[100] == (h, w)


def test_categories_repeating_an_id_count_once_and_nameless_ones_are_flagged(
        coco: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    """The summary counted category records (5 beside "1 categories repeat an id" for 4 classes),
    and a category without a name was named after its id without a word."""
    from shardkit import ShardLoader

    images_dir, ann, doc = coco
    doc["categories"].append({**doc["categories"][1], "name": "auto"})  # id 3 again: the last record names it
    del doc["categories"][0]["name"]
    ann.write_text(json.dumps(doc), encoding="utf-8")
    dst = tmp_path / "out"
    res = CliRunner().invoke(cli, ["pack", str(images_dir), str(dst), "--annotations", str(ann), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert f"samples     {len(doc['images'])}  (4 categories)" in res.output
    assert (f"  - {ann.name}: 1 category repeats an id; kept as 4 categories, each named by the last record of its "
            "id, as pycocotools keeps it (category ids 3)") in res.output
    assert (f'  - {ann.name}: 1 category has no "name"; the loader\'s classes use the id as the name '
            "(category ids 1)") in res.output
    info = CliRunner().invoke(cli, ["info", str(dst)])
    assert "categories  4: 1, auto, dog, toothbrush" in info.output, info.output
    as_json = json.loads(CliRunner().invoke(cli, ["info", str(dst), "--json"]).output)
    assert as_json["num_categories"] == len(as_json["categories"]) == 4  # one entry per id, its last record's
    assert [c["name"] for c in as_json["categories"]] == [None, "auto", "dog", "toothbrush"]
    loader = ShardLoader(str(dst), batch_size=2, num_workers=0, contiguous_labels=True)
    assert loader.classes == ("__background__", "1", "auto", "dog", "toothbrush")


def test_drop_empty_and_resize_refused(coco: tuple[Path, Path, dict[str, Any]],
                                       tmp_path: Path) -> None:
    images_dir, ann, doc = coco
    with_anns = {a["image_id"] for a in doc["annotations"]}
    result = pack_coco(str(images_dir), str(ann), str(tmp_path / "out"), drop_empty=True, workers=1)
    assert result.manifest.num_samples == len(with_anns) < len(doc["images"])
    # how many were left out is recorded, and said by pack and info
    dropped = len(doc["images"]) - len(with_anns)
    assert read_manifest(Store(str(tmp_path / "out"))).extra["drop_empty"] == {"images": dropped}
    for args in (["pack", str(images_dir), str(tmp_path / "cli"), "--annotations", str(ann), "--drop-empty",
                  "--workers", "1"], ["info", str(tmp_path / "out")]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        line = f"dropped     {dropped:,} image{'s' * (dropped != 1)} without annotations (--drop-empty)"
        assert line in res.output.splitlines(), res.output
    plain = pack_coco(str(images_dir), str(ann), str(tmp_path / "all"), workers=1)
    assert "drop_empty" not in plain.manifest.extra
    with pytest.raises(ValueError, match="resize_max"):
        pack_coco(str(images_dir), str(ann), str(tmp_path / "x"),
                  options=PackOptions(resize_max=32))


def test_cli_auto_detects_coco(coco: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    images_dir, ann, doc = coco
    doc["annotations"].append({"id": 77, "image_id": 12345, "category_id": 1, "bbox": [0, 0, 1, 1]})
    ann.write_text(json.dumps(doc), encoding="utf-8")
    runner = CliRunner()
    dst = tmp_path / "out"
    res = runner.invoke(cli, ["pack", str(images_dir), str(dst), "--annotations", str(ann),
                              "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert f"samples     {len(doc['images'])}  (4 categories)" in res.output
    # The dropped annotation is an annotation, not a skipped image.
    assert "skipped     0\n" in res.output
    assert f"annotations {len(doc['annotations']) - 1} packed; 1 dropped\n" in res.output
    assert ("  - instances.json: 1 annotation(s) reference unknown image ids; dropped "
            "(annotation ids 77)" in res.output)
    assert runner.invoke(cli, ["verify", str(dst), "--decode"]).exit_code == 0
    res = runner.invoke(cli, ["pack", "--format", "coco", "--drop-empty", str(images_dir),
                              str(tmp_path / "o2"), "--annotations", str(ann), "-q"])
    assert res.exit_code == 0, res.output
    assert read_manifest(Store(str(tmp_path / "o2"))).num_samples < len(doc["images"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "coco"], "needs --annotations"),
        (["--format", "imagefolder", "--annotations", "x.json"], "--annotations applies to --format coco only"),
        (["--drop-empty"], "--drop-empty applies to --format coco only"),  # names only what was given
        (["--format", "imagefolder", "--annotations", "x.json", "--drop-empty"],
         "--annotations and --drop-empty apply to --format coco only"),
        (["--annotations", "x.json", "--resize-max", "64"], "--resize-max is not supported"),
    ],
)
def test_cli_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(cli, ["pack", str(tmp_path), str(tmp_path / "out"), *args])
    assert res.exit_code == 2 and message in res.output


def test_cli_malformed_json_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [', encoding="utf-8")
    res = CliRunner().invoke(cli, ["pack", str(tmp_path / "img"), str(tmp_path / "out"),
                                   "--annotations", str(bad)])
    assert res.exit_code == 1 and "bad.json: not valid JSON (line 1" in res.output


def test_an_images_folder_holding_none_of_the_images_is_refused_before_dst(coco: tuple[Path, Path, dict[str, Any]],
                                                                         tmp_path: Path) -> None:
    from shardkit.errors import SourceError

    _images, annotations, _doc = coco
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "cats").mkdir(parents=True)
    with pytest.raises(SourceError, match=r"none of the \d+ images .* names is in this folder \(e\.g\. '.*'\): "
                                          "give the folder that holds them"):
        pack_coco(str(elsewhere), str(annotations), str(tmp_path / "out"), workers=1)
    assert not (tmp_path / "out").exists()
