"""Packed shards read whole by other tools: HF ``datasets``, webdataset ``to_tuple``, DALI's
index."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import pack
from shardkit.pack.options import PackOptions
from shardkit.storage import Store

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network


def _pack(tree: Path, dst: Path, **options: Any) -> list[str]:
    pack(str(tree), str(dst), options=PackOptions(max_count=5, **options), workers=1)
    return sorted(str(p) for p in dst.glob("*.tar"))


def _expected(tree: Path) -> dict[str, tuple[int, tuple[int, int]]]:
    """source path -> (label, image size) for every image of an ImageFolder tree."""
    classes = sorted(p.name for p in tree.iterdir())
    out = {}
    for label, name in enumerate(classes):
        for path in sorted((tree / name).iterdir()):
            with Image.open(path) as img:
                out[f"{name}/{path.name}"] = (label, img.size)
    return out


def _hf(shards: list[str], cache: Path) -> Any:
    datasets = pytest.importorskip("datasets")
    return datasets.load_dataset("webdataset", data_files={"train": shards}, split="train",
                                 cache_dir=str(cache))


def test_hf_datasets_loads_every_sample_with_uniform_names(small_tree: Path,
                                                           tmp_path: Path) -> None:
    shards = _pack(small_tree, tmp_path / "out", uniform_names=True)
    manifest = read_manifest(Store(str(tmp_path / "out")))
    assert (manifest.version == 2
            and json.loads((tmp_path / "out" / "index.json").read_text())["version"] == 2)
    assert verify_dataset(str(tmp_path / "out"), decode=True).ok
    ds = _hf(shards, tmp_path / "hf")
    expected = _expected(small_tree)
    assert len(ds) == len(expected) == 12
    formats = set()
    got = {}
    for row in ds:
        image = row["jpg"]  # decoded by HF's Image feature: PIL sniffs the real format
        assert image is not None
        formats.add(image.format)
        meta = row["json"]
        assert (row["cls"] == meta["label"] and meta["class"] == manifest.classes[row["cls"]])  # type: ignore[index]
        got[meta["source"]] = (row["cls"], image.size)
    assert got == expected
    assert formats == {"JPEG", "PNG"}  # the set really mixes formats


def test_default_names_are_what_breaks_hf_datasets(small_tree: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Why uniform names exist: without them HF either refuses the set or drops PNG images; the
    pack says so before it starts, naming the fix."""
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        shards = _pack(small_tree, tmp_path / "out")
    said = [r.getMessage() for r in caplog.records if r.name == "shardkit.pack"]
    assert len(said) == 1 and "HF datasets" in said[0] and "--uniform-names" in said[0], said
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        _pack(small_tree, tmp_path / "uniform", uniform_names=True)
    assert not [r for r in caplog.records if r.name == "shardkit.pack"]
    assert json.loads((tmp_path / "out" / "index.json").read_text())["version"] == 1
    try:
        ds = _hf(shards, tmp_path / "hf")
    except ValueError as err:
        assert "don't share the same prefix or the same types" in str(err)
        return
    images = [row.get("jpg") or row.get("png") for row in ds]
    assert sum(image is not None for image in images) < 12


def test_webdataset_to_tuple_gets_every_sample(small_tree: Path, tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    shards = _pack(small_tree, tmp_path / "out", uniform_names=True)
    dataset = wds.WebDataset(shards, shardshuffle=False).decode("pil")
    rows = list(dataset.to_tuple("jpg", "cls", "json"))
    assert sorted((j["source"], c, im.size) for im, c, j in rows) == sorted(
        (src, label, size) for src, (label, size) in _expected(small_tree).items())


def test_uniform_names_members_and_bytes(small_tree: Path, tmp_path: Path) -> None:
    """Each sample holds exactly cls, jpg, json; the jpg member keeps the source's bytes."""
    import tarfile

    _pack(small_tree, tmp_path / "out", uniform_names=True)
    for shard in (tmp_path / "out").glob("*.tar"):
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
        keys = {name.split(".")[0] for name in members}
        for key in keys:
            assert ({n for n in members if n.startswith(key + ".")}
                    == {f"{key}.cls", f"{key}.jpg", f"{key}.json"})
            source = json.loads(members[f"{key}.json"])["source"]
            assert members[f"{key}.jpg"] == (small_tree / source).read_bytes()
            Image.open(io.BytesIO(members[f"{key}.jpg"])).verify()


def test_shardloader_reads_uniform_names(small_tree: Path, tmp_path: Path) -> None:
    from shardkit import ShardLoader

    _pack(small_tree, tmp_path / "out", uniform_names=True)
    expected = _expected(small_tree)
    labels = []
    with ShardLoader(str(tmp_path / "out"), batch_size=4, shuffle=False, drop_last=False) as loader:
        for images, batch_labels in loader:
            labels += [int(x) for x in batch_labels]
            assert all(tuple(im.shape[1:]) in {(h, w) for _, (w, h) in expected.values()}
                       for im in images)
    assert sorted(labels) == sorted(label for label, _ in expected.values())


def _check_dali_indexes(root: Path) -> int:
    """Every shard has a DALI index whose members' offsets/sizes are tarfile's data offsets."""
    import tarfile

    from shardkit.format.dali_index import dali_index_name, load_dali_index

    shards = sorted(root.glob("*.tar"))
    for shard in shards:
        samples = load_dali_index((root / dali_index_name(shard.name)).read_bytes(),
                                  where=shard.name)
        with tarfile.open(shard) as tar:
            expected = [(m.name, m.name.split(".", 1)[1], m.offset_data, m.size) for m in tar]
        assert [(m.name, m.ext, m.offset, m.size) for s in samples for m in s] == expected
        assert [len(s) for s in samples] == [3] * len(samples)  # cls, image, json per sample
    return len(shards)


def test_pack_dali_index(small_tree: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardkit.cli import cli

    result = CliRunner().invoke(cli, ["pack", str(small_tree), str(tmp_path / "out"), "--max-count",
                                      "5", "--dali-index", "--uniform-names", "--workers", "1",
                                      "-q"])
    assert result.exit_code == 0, result.output
    assert _check_dali_indexes(tmp_path / "out") == 3
    assert read_manifest(Store(str(tmp_path / "out"))).options["dali_index"] is True


def test_index_adds_dali_files_to_a_packed_dataset_only(small_tree: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardkit.cli import cli

    _pack(small_tree, tmp_path / "out")
    before = (tmp_path / "out" / "index.json").read_bytes()
    offsets = sorted((p.name, p.read_bytes()) for p in (tmp_path / "out").glob("*.idx"))
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "out"), "--dali-index"])
    assert result.exit_code == 0 and "wrote 3 DALI index files" in result.output, result.output
    assert (tmp_path / "out" / "index.json").read_bytes() == before
    assert _check_dali_indexes(tmp_path / "out") == 3
    assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "out").glob("*.idx")
                  if not p.name.endswith(".dali.idx")) == offsets
    again = CliRunner().invoke(cli, ["index", str(tmp_path / "out")])
    assert again.exit_code == 1 and "already has index.json" in again.output


def test_hf_datasets_loads_coco_with_the_json_recipe(tmp_path: Path) -> None:
    """The README recipe: ``features={"jpg": Image(), "json": Json()}`` keeps every COCO sample
    and every annotation, polygon and RLE segmentation alike (Arrow cannot infer one type)."""
    datasets = pytest.importorskip("datasets")
    from shardkit.pack import pack_coco

    root = Path(__file__).resolve().parents[2] / "sample_data" / "coco"
    instances = json.loads((root / "instances.json").read_text(encoding="utf-8"))
    assert {type(a["segmentation"]) for a in instances["annotations"]} == {list, dict}  # both kinds
    pack_coco(str(root / "images"), str(root / "instances.json"), str(tmp_path / "out"),
              options=PackOptions(max_count=10, uniform_names=True), workers=1)
    shards = sorted(str(p) for p in (tmp_path / "out").glob("*.tar"))
    features = datasets.Features({"jpg": datasets.Image(), "json": datasets.Json()})
    ds = datasets.load_dataset("webdataset", data_files={"train": shards}, split="train",
                               cache_dir=str(tmp_path / "hf"), features=features)
    assert len(ds) == len(instances["images"])
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in instances["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    for row in ds:
        record = row["json"]["image"]
        assert row["jpg"].size == (record["width"], record["height"])
        # polygons and RLE intact
        assert row["json"]["annotations"] == by_image.get(record["id"], [])


def test_captioned_shards_read_by_webdataset_and_hf_datasets(tmp_path: Path) -> None:
    """Packed image-text pairs, read whole: webdataset's decode("pil").to_tuple("jpg", "txt") and HF
    datasets' webdataset loader give every image with its caption and json."""
    import webdataset as wds

    from shardkit.pack import pack_captions
    from tests.trees import make_caption_folder

    captions = make_caption_folder(tmp_path / "src")
    pack_captions(str(tmp_path / "src"), str(tmp_path / "out"), options=PackOptions(max_count=4), workers=1)
    shards = sorted(str(p) for p in (tmp_path / "out").glob("*.tar"))
    pairs = wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode("pil").to_tuple("jpg", "txt", "json")
    got = {meta["source"]: (text, image.size) for image, text, meta in pairs}
    sizes = {}
    for rel in captions:
        with Image.open(tmp_path / "src" / rel) as img:
            sizes[rel] = img.size
    assert got == {rel: (text, sizes[rel]) for rel, text in captions.items()}
    rows = {row["json"]["source"]: (row["txt"], row["jpg"].size, row["json"]["width"])
            for row in _hf(shards, tmp_path / "hf")}
    assert rows == {rel: (text, sizes[rel], sizes[rel][0]) for rel, text in captions.items()}
