"""``shardkit bench`` end to end on a tiny generated tree (no timing assertions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from sample_data.generate import make_imagenet_like
from shardkit.bench import SCHEMA
from shardkit.cli import cli
from shardkit.pack import pack


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("benchcli") / "tree"
    make_imagenet_like(root, classes=2, per_class=12, seed=0, size=(80, 60))
    return root


def test_bench_end_to_end(tree: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = CliRunner().invoke(cli, [
        "bench", str(tree), "--workers", "1", "--batch-size", "4", "--size", "32", "--repeats", "1",
        "--epochs", "1", "--warmup", "1", "--out", str(out), "--plot", str(png),
    ])
    assert result.exit_code == 0, result.output
    assert "torchvision ImageFolder + DataLoader [baseline]" in result.output
    assert "ShardLoader" in result.output and "webdataset" in result.output
    assert "\npack: 24 images" in result.output  # packed into a temporary directory first
    report = json.loads(out.read_text())
    assert report["schema"] == SCHEMA
    assert [r["name"] for r in report["results"]] == ["imagefolder", "webdataset", "shardloader"]
    for r in report["results"]:
        assert r["batch_shape"] == [4, 3, 32, 32]
        assert len(r["images_per_second"]["runs"]) == 1
    assert report["pack"]["images"] == 24
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_reuses_given_shards(tree: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    args = ["bench", str(tree), "--shards", str(shards), "--workers", "0", "--batch-size", "6",
            "--size", "16", "--repeats", "1", "--epochs", "1", "--warmup", "0", "--no-webdataset",
            "--transform", "val"]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert (shards / "index.json").exists() and "\npack: 24 images" in first.output
    second = CliRunner().invoke(cli, args)
    assert second.exit_code == 0, second.output
    assert "\npack: " not in second.output and "WebLoader" not in second.output


def test_bench_rejects_too_large_batch(tree: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", str(tree), "--batch-size", "100", "--workers", "0"])
    assert result.exit_code == 2
    assert "no full batch" in result.output


def test_bench_refuses_shards_of_other_data(tree: Path, tmp_path: Path) -> None:
    other = tmp_path / "other" / "only"
    other.mkdir(parents=True)
    shutil.copy(next(p for p in sorted(tree.rglob("*")) if p.is_file()), other / "x.jpg")
    shards = tmp_path / "shards"
    pack(str(other.parent), str(shards), workers=1)
    result = CliRunner().invoke(cli, ["bench", str(tree), "--shards", str(shards), "--workers", "0",
                                      "--batch-size", "2", "--repeats", "1", "--epochs", "1",
                                      "--warmup", "0"])
    assert result.exit_code != 0 and "not be on the same data" in result.output


COCO = Path(__file__).resolve().parents[2] / "sample_data" / "coco"


def test_bench_on_a_coco_source(tree: Path, tmp_path: Path) -> None:
    """CocoDetection against ShardLoader's COCO route on the same images (those with annotations),
    with the same detection_train steps; lists of images are counted per image."""
    out, shards = tmp_path / "coco.json", tmp_path / "coco-shards"
    args = ["bench", str(COCO / "images"), "--annotations", str(COCO / "instances.json"), "--shards", str(shards),
            "--size", "64", "--max-size", "96", "--batch-size", "2", "--workers", "0", "--repeats", "1",
            "--epochs", "1", "--warmup", "1", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "torchvision CocoDetection + DataLoader [baseline]" in result.output
    assert "ShardLoader (COCO route)" in result.output and "detection_train(64, 96)" in result.output
    annotated = {a["image_id"] for a in json.loads((COCO / "instances.json").read_text())["annotations"]}
    report = json.loads(out.read_text())
    assert [r["name"] for r in report["results"]] == ["cocodetection", "shardloader"]
    assert report["conditions"]["data"]["images"] == len(annotated)
    assert report["pack"]["images"] == len(annotated)  # packed with drop_empty, like the baseline's images
    per_run = (len(annotated) // 2 - 1) * 2  # full batches after the warm-up one
    for r in report["results"]:
        assert r["images_per_run"] == per_run and r["batch_shape"] == [2]
    wrong = CliRunner().invoke(cli, ["bench", str(tree), "--shards", str(shards), "--workers", "0",
                                     "--batch-size", "2", "--repeats", "1", "--epochs", "1"])
    assert wrong.exit_code == 2 and "not be on the same data" in wrong.output


def test_the_train_choices_are_the_librarys_models_and_contenders() -> None:
    """The CLI spells them out (so that its --help imports no torch): they must be the library's."""
    from shardkit.bench.train import MODELS, TRAIN_CONTENDERS
    from shardkit.bench.train_detection import DETECTION_CONTENDERS, DETECTION_MODELS
    from shardkit.cli import bench
    from shardkit.cli.bench import bench_command

    choices = {p.name: tuple(p.type.choices) for p in bench_command.params  # type: ignore[attr-defined]
               if p.name in ("contenders", "train_model")}
    assert choices["contenders"] == tuple(dict.fromkeys(TRAIN_CONTENDERS + DETECTION_CONTENDERS))
    assert (bench.CLASSIFIER_CONTENDERS, bench.DETECTOR_CONTENDERS) == (TRAIN_CONTENDERS, DETECTION_CONTENDERS)
    assert choices["train_model"] == MODELS + DETECTION_MODELS
