"""scan_coco: records kept exactly, torchvision's order, clear errors, warnings with counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sample_data.coco_gen import make_coco
from shardkit.errors import SourceError
from shardkit.sources import scan_coco


@pytest.fixture
def coco(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    images_dir, ann = make_coco(tmp_path / "coco", images=12)
    return images_dir, ann, json.loads(ann.read_text(encoding="utf-8"))


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_one_sample_per_image_sorted_by_id_with_records_exactly(
        coco: tuple[Path, Path, dict[str, Any]]) -> None:
    images_dir, ann, doc = coco
    listing = scan_coco(str(images_dir), str(ann))
    expected_ids = sorted(im["id"] for im in doc["images"])
    assert [s.meta["image"]["id"] for s in listing.samples if s.meta] == expected_ids
    by_id = {im["id"]: im for im in doc["images"]}
    for s in listing.samples:
        assert s.meta is not None and s.label is None
        assert s.meta["image"] == by_id[s.meta["image"]["id"]]
        assert (s.meta["annotations"]
                == [a for a in doc["annotations"] if a["image_id"] == s.meta["image"]["id"]])
        assert s.rel == s.meta["image"]["file_name"]
        assert s.size == Path(s.path).stat().st_size > 0
    assert listing.kind == "coco" and listing.categories == doc["categories"]
    assert listing.extra == {"info": doc["info"], "licenses": doc["licenses"]}
    assert listing.warnings == []
    rels = {s.rel for s in listing.samples}
    assert {"sub/dir/deep_0001.jpg", "café_ü_0002.jpg"} <= rels
    assert sum(1 for s in listing.samples if s.meta and not s.meta["annotations"]) == 4


def test_drop_empty(coco: tuple[Path, Path, dict[str, Any]]) -> None:
    images_dir, ann, _ = coco
    listing = scan_coco(str(images_dir), str(ann), drop_empty=True)
    assert (len(listing.samples) == 8
            and all(s.meta and s.meta["annotations"] for s in listing.samples))


def test_missing_file_on_disk_has_size_minus_one(coco: tuple[Path, Path, dict[str, Any]]) -> None:
    images_dir, ann, _ = coco
    (images_dir / "img_0005.jpg").unlink()
    listing = scan_coco(str(images_dir), str(ann))
    sizes = {s.rel: s.size for s in listing.samples}
    assert sizes["img_0005.jpg"] == -1 and len(sizes) == 12


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [\n  {"id": 1,}\n]}', encoding="utf-8")
    with pytest.raises(SourceError, match=r"bad\.json: not valid JSON \(line 2, column"):
        scan_coco(str(tmp_path / "img"), str(bad))
    bad.write_bytes(b'{"images": "\xff"}')
    with pytest.raises(SourceError, match="not valid JSON"):
        scan_coco(str(tmp_path / "img"), str(bad))
    with pytest.raises(SourceError, match="annotations file does not exist"):
        scan_coco(str(tmp_path / "img"), str(tmp_path / "nope.json"))
    with pytest.raises(SourceError, match="images directory does not exist"):
        scan_coco(str(tmp_path / "nope"), str(bad))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("images"), 'missing "images"'),
        (lambda d: d.pop("categories"), 'missing "categories"'),
        (lambda d: d.update(annotations={}), '"annotations" must be a list'),
        (lambda d: d["images"][3].pop("id"), r'images\[3\]: missing "id"'),
        (lambda d: d["images"][0].pop("file_name"), r'images\[0\]: missing "file_name"'),
        (lambda d: d["images"][1].update(file_name=None),  # said "an integer or string", and an integer is no path
         r'images\[1\]: "file_name" must be a string \(a path inside the images folder\), not None'),
        (lambda d: d["images"].__setitem__(2, "x.jpg"), r"images\[2\]: must be an object"),
        (lambda d: d["annotations"][5].pop("image_id"), r'annotations\[5\]: missing "image_id"'),
        (lambda d: d["annotations"][1].pop("category_id"),
         r'annotations\[1\]: missing "category_id"'),
        (lambda d: d["annotations"][0].pop("id"), r'annotations\[0\]: missing "id"'),
        (lambda d: d["annotations"][2].update(image_id=[1]),
         r'annotations\[2\]: "image_id" must be an integer'),
        (lambda d: d["categories"][1].pop("id"), r'categories\[1\]: missing "id"'),
        (lambda d: d.update(images=[]), '"images" is empty: the file lists no image to pack'),
        (lambda d: d.update(categories=[]), '"categories" is empty, so each of the [0-9,]+ annotations names an '
                                            "unknown category"),
    ],
)
def test_missing_required_keys_name_the_place(coco: tuple[Path, Path, dict[str, Any]], mutate: Any,
                                              message: str) -> None:
    images_dir, ann, doc = coco
    mutate(doc)
    with pytest.raises(SourceError, match=message) as info:
        scan_coco(str(images_dir), str(_write(ann, doc)))
    assert info.value.where == str(ann)
    with pytest.raises(SourceError, match="top level must be a JSON object"):
        scan_coco(str(images_dir), str(_write(ann, [doc])))


def test_bad_references_and_boxes_are_warned_with_counts(
        coco: tuple[Path, Path, dict[str, Any]]) -> None:
    images_dir, ann, doc = coco
    n_anns = len(doc["annotations"])
    base = {"iscrowd": 0, "area": 1.0}
    doc["annotations"] += [
        {"id": 1, "image_id": 999, "category_id": 1, "bbox": [0, 0, 1, 1], **base},
        {"id": 2, "image_id": 998, "category_id": 1, "bbox": [0, 0, 1, 1], **base},
        # 2: not a category
        {"id": 3, "image_id": 100, "category_id": 2, "bbox": [0, 0, 1, 1], **base},
        {"id": 4, "image_id": 100, "category_id": 3, "bbox": [-5, 0, 10, 10], **base},
        {"id": 5, "image_id": 100, "category_id": 3, "bbox": [0, 0, 10_000, 10], **base},
        {"id": 6, "image_id": 100, "category_id": 3, "bbox": [0, 0, -1, 5], **base},
    ]
    doc["images"].insert(0, {**doc["images"][0], "file_name": "dup.jpg"})  # repeats an id: the later record packs
    doc["images"].append({"id": 5000, "file_name": "../escape.jpg"})
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    # Image records that cannot be packed are skipped inputs ...
    images = {(w["source"], w["reason"]) for w in listing.warnings}
    assert any(s == "dup.jpg" and r.startswith("images[") and "repeated image id (id " in r for s, r in images)
    assert any(s == "../escape.jpg" and "not a path inside the images folder" in r
               for s, r in images)
    assert len(listing.warnings) == 2
    # ... annotation problems are reported as annotations, with counts, never as skipped images.
    problems = {(p["source"], p["reason"], p["annotations"], p["dropped"])
                for p in listing.annotation_problems}
    assert ("instances.json",
            "2 annotation(s) reference unknown image ids; dropped (annotation ids 1, 2)", 2,
            True) in problems
    assert ("instances.json",
            "1 annotation(s) have unknown category_id 2; dropped (annotation ids 3)", 1,
            True) in problems
    assert ("img_0000.jpg", "2 annotation bbox(es) extend outside the "
            f"{doc['images'][-2]['width']}x{doc['images'][-2]['height']} image; kept as is "
            "(annotation ids 4, 5)",
            2, False) in problems
    assert any(s == "img_0000.jpg" and r.startswith("1 annotation bbox(es) have a negative width or height")
               and (n, d) == (1, False)
               for s, r, n, d in problems)
    assert len(listing.annotation_problems) == 4
    assert len(listing.samples) == 12  # the rest continues
    first = next(s for s in listing.samples if s.meta and s.meta["image"]["id"] == 100)
    assert first.meta is not None and [a["id"] for a in first.meta["annotations"]][-3:] == [4, 5, 6]
    kept = sum(len(s.meta["annotations"]) for s in listing.samples if s.meta)
    assert kept == n_anns + 3


def test_ids_other_than_the_files_integers_are_not_packed(tmp_path: Path) -> None:
    """A string id among integer ones was packed, and CocoDetection, COCO's evaluation (which sort
    the ids) and the evaluation recipe then failed on the mix; a file of string ids alone is taken."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "b.jpg").write_bytes(b"b")  # c.jpg is missing: listed with size -1
    (tmp_path / "img" / "a.jpg").write_bytes(b"a")
    doc: dict[str, Any] = {"images": [{"id": "b", "file_name": "b.jpg"}, {"id": 7, "file_name": "a.jpg"},
                      {"id": "a", "file_name": "c.jpg"}],
           "annotations": [{"id": 1, "image_id": "b", "category_id": 1, "bbox": [0, 0, 1, 1]}],
           "categories": [{"id": 1, "name": "x"}]}
    listing = scan_coco(str(tmp_path / "img"), str(_write(tmp_path / "i.json", doc)))
    assert [s.rel for s in listing.samples] == ["c.jpg", "b.jpg"]  # the string ids, most of the file's
    assert [w["reason"] for w in listing.warnings] == [
        "images[1]: id 7 is of another kind than most of the file's image ids (strings: 2 of 3), and a mix cannot be "
        "put in order; not packed"]
    doc["images"].append({"id": 8, "file_name": "d.jpg"})  # as many integers as strings: the integers are kept
    listing = scan_coco(str(tmp_path / "img"), str(_write(tmp_path / "i.json", doc)))
    assert [s.rel for s in listing.samples] == ["a.jpg", "d.jpg"]
    assert [w["reason"].split(" is of")[0] for w in listing.warnings] == ["images[0]: id 'b'", "images[2]: id 'a'"]
    del doc["images"][1], doc["images"][-1]  # string ids alone: in their order, as CocoDetection sorts them
    listing = scan_coco(str(tmp_path / "img"), str(_write(tmp_path / "i.json", doc)))
    assert [s.rel for s in listing.samples] == ["c.jpg", "b.jpg"] and [s.size for s in listing.samples] == [-1, 1]


def test_a_folder_holding_none_of_the_images_is_refused(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    doc = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
           "annotations": [], "categories": []}
    with pytest.raises(SourceError, match=r"none of the 2 images i.json names is in this folder \(e\.g\. 'a\.jpg'\)"):
        scan_coco(str(tmp_path / "img"), str(_write(tmp_path / "i.json", doc)))


def test_images_and_annotations_by_url_list_as_on_disk(coco: tuple[Path, Path, dict[str, Any]],
                                                       s3_server: dict[str, Any],
                                                       s3_bucket: str) -> None:
    from tests.conftest import upload_tree

    images_dir, ann, _ = coco
    (images_dir / "img_0005.jpg").unlink()  # a record without its file: size -1 either way
    upload_tree(images_dir.parent, f"{s3_bucket}/coco", s3_server)
    local = scan_coco(str(images_dir), str(ann))
    for images in (f"{s3_bucket}/coco/images", str(images_dir)):
        remote = scan_coco(images, f"{s3_bucket}/coco/{ann.name}", storage_options=s3_server)
        assert ([(s.rel, s.size, s.meta) for s in remote.samples]
                == [(s.rel, s.size, s.meta) for s in local.samples])
        assert (remote.categories, remote.extra, remote.meta_digest) == (
            local.categories, local.extra, local.meta_digest)
    with pytest.raises(SourceError, match="annotations file does not exist") as err:
        scan_coco(f"{s3_bucket}/coco/images", f"{s3_bucket}/coco/nope.json",
                  storage_options=s3_server)
    assert err.value.where == f"{s3_bucket}/coco/nope.json"
    with pytest.raises(SourceError, match="images directory does not exist"):
        scan_coco(f"{s3_bucket}/coco/nope", f"{s3_bucket}/coco/{ann.name}", storage_options=s3_server)


def test_malformed_segmentations_are_flagged_and_verify_warns(coco: tuple[Path, Path, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardkit.cli import cli
    from shardkit.pack import pack_coco

    images_dir, ann, doc = coco
    first = doc["images"][0]
    base = {"image_id": first["id"], "category_id": doc["categories"][0]["id"], "bbox": [0, 0, 2, 2], "area": 4}
    doc["annotations"] = [
        {"id": 1, **base, "segmentation": "garbage"},
        {"id": 2, **base, "segmentation": {"size": [1, 1], "counts": "abc"}},  # another image's size
        {"id": 3, **base, "segmentation": [[0, 0, 2, 2]]},  # 4 numbers: pycocotools takes them for a box
        {"id": 4, **base, "segmentation": [[0, 0, 2, 0, 2, 2]]},  # fine
        {"id": 5, **base, "segmentation": {"size": [first["height"], first["width"]], "counts": [0, 4]}},  # fine
    ]
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    [flagged] = [p for p in listing.annotation_problems if "segmentation" in p["reason"]]
    assert flagged["reason"] == ("3 annotation segmentation(s) are malformed (need polygons whose first has more "
                                 "than 4 coordinates, or an RLE of the image's size), so a loader with masks=True "
                                 "replaces the image; kept as is (annotation ids 1, 2, 3)")
    assert (flagged["annotations"], flagged["dropped"]) == (3, False)
    pack_coco(str(images_dir), str(ann), str(tmp_path / "out"), workers=1)
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output  # allowed: a loader without masks reads them
    assert "WARN malformed segmentation in 3 annotations: " in result.output
    assert "a loader with masks=True replaces those images with others" in result.output
    info = CliRunner().invoke(cli, ["info", str(tmp_path / "out")])  # says what the pack said of them
    assert info.exit_code == 0 and "annotations 5 packed; 0 dropped, 3 kept, flagged" in info.output
    assert "3 annotation segmentation(s) are malformed" in info.output
    labelled = [line for line in info.output.splitlines() if not line.startswith(" ")]
    assert {line[12:13] != " " and line[11] == " " for line in labelled} == {True}, info.output  # one value column
    as_json = CliRunner().invoke(cli, ["info", str(tmp_path / "out"), "--json"])
    assert json.loads(as_json.output)["annotation_report"]["kept_with_problems"] == 3
    index = tmp_path / "out" / "index.json"
    doc = json.loads(index.read_text())
    doc["annotation_report"] = {"packed": 1}  # edited by hand
    index.write_text(json.dumps(doc))
    CliRunner().invoke(cli, ["index", "--table", str(tmp_path / "out")])
    edited = CliRunner().invoke(cli, ["info", str(tmp_path / "out")])
    assert edited.exit_code == 0, edited.output  # left out, not a traceback
    assert "annotations" not in edited.output and "samples" in edited.output


def test_an_annotation_the_loader_cannot_read_is_dropped_when_packed(coco: tuple[Path, Path, dict[str, Any]],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A bbox that is not 4 numbers ("oops", 3 numbers, none) or a non-numeric area was kept as is:
    the loader then replaced its whole image every epoch, and verify failed the pack. It is dropped
    with its reason, and the image loads; verify still fails a pack that kept one (packed before)."""
    from click.testing import CliRunner

    from shardkit import ShardLoader
    from shardkit.cli import cli
    from shardkit.pack import pack_coco
    from shardkit.sources import coco as coco_source

    images_dir, ann, doc = coco
    bad = doc["annotations"][:6]
    bad[0]["bbox"], bad[1]["bbox"], bad[3]["area"] = "oops", [1, 2, 3], "big"
    bad[4]["bbox"], bad[5]["area"] = [1, 2, "3", 4], "12"  # strings of digits: read as numbers, unflagged
    del bad[2]["bbox"]
    ids = ", ".join(str(a["id"]) for a in bad[:5]) + ", … 1 more"  # five named
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    assert {"source": ann.name, "reason": "6 annotation(s) have a bbox that is not 4 numbers, or an area or iscrowd "
            f"that is not a number; dropped (a loader would replace their image) (annotation ids {ids})",
            "annotations": 6, "dropped": True} in listing.annotation_problems
    pack_coco(str(images_dir), str(ann), str(tmp_path / "out"), workers=1)
    assert CliRunner().invoke(cli, ["verify", str(tmp_path / "out")]).exit_code == 0
    loader = ShardLoader(str(tmp_path / "out"), batch_size=2, num_workers=0, on_error="raise", shuffle=False)
    assert sum(len(images) for images, _ in loader) == len(doc["images"])

    monkeypatch.setattr(coco_source, "_unreadable", lambda _ann: False)  # as packs made before kept them
    pack_coco(str(images_dir), str(ann), str(tmp_path / "kept"), workers=1)
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "kept")])
    assert result.exit_code == 1
    assert (f"annotation {bad[1]['id']!r}: bbox is not 4 numbers ([1, 2, 3]): the loader replaces "
            "this image with another") in result.output


def test_annotations_of_an_image_not_packed_are_said_to_be_so(coco: tuple[Path, Path, dict[str, Any]]) -> None:
    images_dir, ann, doc = coco
    doc["images"].append({"id": 5000, "file_name": "../../etc/passwd"})
    category = doc["categories"][0]["id"]
    doc["annotations"] += [{"id": 90001, "image_id": 5000, "category_id": category, "bbox": [0, 0, 1, 1]},
                           {"id": 90002, "image_id": 6000, "category_id": category, "bbox": [0, 0, 1, 1]}]
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    reasons = [p["reason"] for p in listing.annotation_problems]
    assert ("1 annotation(s) belong to image records not packed (skipped above); dropped (annotation ids 90001)"
            in reasons)
    assert "1 annotation(s) reference unknown image ids; dropped (annotation ids 90002)" in reasons


def test_repeated_image_ids_are_one_kind_of_skip(coco: tuple[Path, Path, dict[str, Any]]) -> None:
    from shardkit.pack.skips import describe_reasons

    images_dir, ann, doc = coco
    doc["images"] += [{**doc["images"][0], "file_name": "dup1.jpg"}, {**doc["images"][1], "file_name": "dup2.jpg"}]
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    assert describe_reasons(listing.warnings) == "2 repeated image ids"  # one kind, whatever the ids


def test_an_image_record_without_a_positive_width_or_height_is_not_packed(
        coco: tuple[Path, Path, dict[str, Any]]) -> None:
    """Its "wide" was copied into the pack; it is a skipped input now, as a bad file_name is."""
    images_dir, ann, doc = coco
    doc["images"][0]["width"] = "wide"
    doc["images"][4]["height"] = None
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    reasons = {w["source"]: w["reason"] for w in listing.warnings}
    assert reasons[doc["images"][0]["file_name"]] == ('images[0]: "width" must be a positive number of pixels, not '
                                                      "'wide'; not packed")
    assert reasons[doc["images"][4]["file_name"]].startswith('images[4]: "height" must be a positive number')
    packed = {s.rel for s in listing.samples}
    assert doc["images"][0]["file_name"] not in packed and doc["images"][4]["file_name"] not in packed


def test_annotation_ids_shared_by_records_are_flagged_and_every_record_kept(
        coco: tuple[Path, Path, dict[str, Any]]) -> None:
    """Two records with one id were packed without a word. Each is still packed as written, in its
    own image's sample; the flag says that CocoDetection gives the last record of the id instead."""
    from torchvision.datasets import CocoDetection

    images_dir, ann, doc = coco
    first, second = doc["annotations"][:2]
    assert first["image_id"] == second["image_id"] and first["bbox"] != second["bbox"]
    first["id"] = second["id"]
    listing = scan_coco(str(images_dir), str(_write(ann, doc)))
    assert {"source": ann.name,
            "reason": "2 annotation(s) share their id with another record; kept as written, each record once in its "
                      "own image's sample, where CocoDetection (pycocotools keys annotations by id) gives the last "
                      f"record of an id once per record of it (annotation ids {second['id']})",
            "annotations": 2, "dropped": False} in listing.annotation_problems
    sample = next(s for s in listing.samples if s.meta and s.meta["image"]["id"] == first["image_id"])
    assert sample.meta is not None and sample.meta["annotations"][:2] == [first, second]
    reference = CocoDetection(str(images_dir), str(ann))
    assert reference._load_target(first["image_id"])[:2] == [second, second]  # the difference the flag names
