"""A saved HF ``datasets`` dataset of labelled images (an ``Image`` and a ``ClassLabel`` column)
packs into labelled shards: the ClassLabel's names are the classes, each row one sample."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit import ShardLoader
from shardkit.cli import cli
from shardkit.errors import SourceError
from shardkit.format import iter_samples
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import pack, pack_captions
from shardkit.storage import Store
from tests.conftest import encode_image

datasets = pytest.importorskip("datasets")

NAMES = ["cat", "dog", "eel"]


def _saved(path: Path, labels: list[int], dict_split: str | None = None) -> Path:
    rows = {"image": [Image.new("RGB", (8 + i, 6), (20 * i, 200 - 20 * i, 7)) for i in range(len(labels))],
            "label": labels}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    ds = datasets.Dataset.from_dict(rows, features=features)
    (datasets.DatasetDict({dict_split: ds}) if dict_split else ds).save_to_disk(str(path))
    return path


def _packed_rows(dst: Path) -> dict[str, tuple[int, tuple[int, int], bytes]]:
    """Each packed sample by its source (``row N``): label, image size and pixels."""
    out = {}
    for shard in read_manifest(Store(str(dst))).shards:
        with open(dst / shard.url, "rb") as f:
            for _key, fields in iter_samples(f, where=shard.url):
                meta = json.loads(fields["json"])
                image = Image.open(io.BytesIO(next(v for k, v in fields.items() if k in ("png", "jpg"))))
                out[meta["source"]] = (int(fields["cls"]), image.size, image.convert("RGB").tobytes())
    return out


def test_the_rows_become_labelled_samples_named_by_the_classlabel(tmp_path: Path) -> None:
    labels = [0, 1, 2, 1, 0, 2, 2]
    saved = _saved(tmp_path / "saved", labels)
    result = CliRunner().invoke(cli, ["pack", str(saved), str(tmp_path / "out"), "--workers", "2",
                                      "--max-count", "3"])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(Store(str(tmp_path / "out")))
    assert manifest.kind == "imagefolder" and list(manifest.classes or ()) == NAMES and manifest.num_samples == 7
    rows = datasets.load_from_disk(str(saved))
    packed = _packed_rows(tmp_path / "out")
    for i, row in enumerate(rows):
        image = row["image"].convert("RGB")
        assert packed[f"row {i + 1}"] == (row["label"], image.size, image.tobytes())
    with ShardLoader(str(tmp_path / "out"), batch_size=7, shuffle=False) as loader:
        [(_images, got)] = list(loader)
    assert sorted(got.tolist()) == sorted(labels)
    assert verify_dataset(str(tmp_path / "out")).ok


def test_load_dataset_imagefolder_packs_as_torchvision_reads_the_tree(tmp_path: Path) -> None:
    """The common way to such a dataset: ``load_dataset("imagefolder")``; its classes and labels
    are the tree's as torchvision's ImageFolder gives them, each sample named by its file."""
    from torchvision.datasets import ImageFolder

    tree = tmp_path / "tree"
    for c, name in enumerate(NAMES):
        (tree / name).mkdir(parents=True)
        for j in range(2 + c):
            (tree / name / f"{name}{j}.jpg").write_bytes(encode_image((10, 8), color=(60 * c, 40 * j, 5)))
    ds = datasets.load_dataset("imagefolder", data_dir=str(tree), split="train")
    ds.save_to_disk(str(tmp_path / "saved"))
    result = pack(str(tmp_path / "saved"), str(tmp_path / "out"), workers=1)
    reference = ImageFolder(str(tree))
    assert list(result.manifest.classes or ()) == reference.classes
    by_file = {Path(path).name: label for path, label in reference.samples}
    packed = _packed_rows(tmp_path / "out")
    assert {Path(source).name: label for source, (label, _, _) in packed.items()} == by_file


def test_a_dataset_dict_needs_its_split_and_rows_without_a_label_are_skipped(tmp_path: Path) -> None:
    saved = _saved(tmp_path / "saved", [0, -1, 2], dict_split="train")
    result = CliRunner().invoke(cli, ["pack", str(saved), str(tmp_path / "out")])
    assert result.exit_code == 1 and "a DatasetDict: name its split (train) with --split" in result.output
    result = CliRunner().invoke(cli, ["pack", str(saved), str(tmp_path / "out"), "--split", "train"])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(Store(str(tmp_path / "out")))
    assert manifest.num_samples == 2
    assert [(s["source"], s["reason"]) for s in manifest.skipped] == [("row 2", "no label (the 'label' column is -1)")]


def test_caption_options_and_the_caption_route_say_what_a_labelled_dataset_is(tmp_path: Path) -> None:
    saved = _saved(tmp_path / "saved", [0, 1])
    result = CliRunner().invoke(cli, ["pack", str(saved), str(tmp_path / "out"), "--format", "imagefolder",
                                      "--caption-column", "label"])
    assert result.exit_code == 2 and "(--format captions); " in result.output and \
        "is packed as labelled images (--format imagefolder)" in result.output, result.output
    # a caption option chooses the captions route for a dataset that has a ClassLabel too
    rows = datasets.load_from_disk(str(saved)).add_column("description", ["a cat", "a dog"])
    rows.save_to_disk(str(tmp_path / "both"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "both"), str(tmp_path / "out-both"),
                                      "--caption-column", "description"])
    assert result.exit_code == 0, result.output
    assert read_manifest(Store(str(tmp_path / "out-both"))).kind == "captions"
    with pytest.raises(SourceError, match="its ClassLabel column 'label' makes it a labelled dataset: pack it as one"):
        pack_captions(str(saved), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="split, image_column and label_column apply to a saved HF dataset"):
        pack(str(tmp_path), str(tmp_path / "out"), split="train")


def test_a_dataset_saved_again_with_other_images_is_not_taken_for_the_one_packed(tmp_path: Path) -> None:
    """Rows have no file size of their own: they counted as 0 bytes, and a dataset saved again with
    every image changed was 'already packed … nothing to do', its old pixels kept."""
    saved = _saved(tmp_path / "saved", [0, 1, 2])
    assert CliRunner().invoke(cli, ["pack", str(saved), str(tmp_path / "out")]).exit_code == 0
    bigger = datasets.load_from_disk(str(saved)).map(lambda row: {"image": row["image"].resize((64, 64))})
    bigger.save_to_disk(str(tmp_path / "saved2"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "saved2"), str(tmp_path / "out")])
    assert result.exit_code == 1 and "a different packed dataset" in result.output, result.output


def test_a_split_is_judged_by_its_own_columns_and_an_empty_dataset_is_said(tmp_path: Path) -> None:
    """A DatasetDict whose first split has integer labels and whose train split a ClassLabel: auto
    went by the first split's columns and took the captions route."""
    labelled = datasets.load_from_disk(str(_saved(tmp_path / "one", [0, 1])))
    plain = labelled.cast_column("label", datasets.Value("int64"))
    datasets.DatasetDict({"test": plain, "train": labelled}).save_to_disk(str(tmp_path / "dd"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "dd"), str(tmp_path / "out"), "--split", "train"])
    assert result.exit_code == 0, result.output
    labelled.select([]).save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="holds no rows"):
        pack(str(tmp_path / "empty"), str(tmp_path / "out-empty"))


def test_formats_and_columns_a_dataset_was_saved_with_are_taken_or_named(tmp_path: Path) -> None:
    # saved with a format set (torch): rows came back as tensors, and the pack ended in a traceback
    rows = datasets.load_from_disk(str(_saved(tmp_path / "plain", [0, 1])))
    rows.with_format("torch").save_to_disk(str(tmp_path / "torch"))
    assert pack(str(tmp_path / "torch"), str(tmp_path / "out-torch"), workers=1).manifest.num_samples == 2
    # two ClassLabel columns (CIFAR-100's fine and coarse labels): named with --label-column
    two = rows.add_column("coarse", [1, 0]).cast_column("coarse", datasets.ClassLabel(names=["x", "y"]))
    two.save_to_disk(str(tmp_path / "two"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "two"), str(tmp_path / "out-two")])
    assert result.exit_code == 1 and "2 ClassLabel columns (label, coarse): name one with --label-column" in \
        result.output, result.output
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "two"), str(tmp_path / "out-two"),
                                      "--label-column", "coarse"])
    assert result.exit_code == 0, result.output
    assert list(read_manifest(Store(str(tmp_path / "out-two"))).classes or ()) == ["x", "y"]
    # two Image columns: named with --image-column
    images = [Image.new("RGB", (8, 6), (9 * i, 0, 0)) for i in range(2)]
    features = datasets.Features({"image": datasets.Image(), "mask": datasets.Image(),
                                  "label": datasets.ClassLabel(names=NAMES)})
    datasets.Dataset.from_dict({"image": images, "mask": images, "label": [0, 1]}, features=features).save_to_disk(
        str(tmp_path / "img2"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "img2"), str(tmp_path / "out-img2"),
                                      "--format", "imagefolder"])
    assert result.exit_code == 1 and "2 Image columns (image, mask): name one with --image-column" in result.output
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "img2"), str(tmp_path / "out-img2"),
                                      "--format", "imagefolder", "--image-column", "mask"])
    assert result.exit_code == 0, result.output
    # an integer label column is no ClassLabel: said how to make it one
    ints = rows.cast_column("label", datasets.Value("int64"))
    ints.save_to_disk(str(tmp_path / "ints"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "ints"), str(tmp_path / "out-ints"),
                                      "--format", "imagefolder"])
    assert result.exit_code == 1 and "no ClassLabel column among image, label" in result.output
    assert "dataset.class_encode_column(...)" in result.output and "(label holds integers)" in result.output
