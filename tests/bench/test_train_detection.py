"""``shardkit bench --annotations --train DETECTOR``: the detection step-fed measurement's plumbing, on the
CPU with the smallest detector at a tiny size (no timing assertions)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from shardkit.bench import train_detection
from shardkit.bench.train_detection import (
    DetectionBenchConfig,
    DetectionStep,
    format_detection_table,
    run_detection_train_bench,
)
from shardkit.cli import cli
from shardkit.pack import PackOptions, pack, pack_coco
from tests.bench.train_checks import check_runs, stop_in_run

COCO = Path(__file__).resolve().parents[2] / "sample_data" / "coco"
MODEL = "fasterrcnn_mobilenet_v3_large_fpn"
#: sample_data/coco's category ids, in the order of ShardLoader's contiguous labels 1..15.
CATEGORY_IDS = [1, 17, 47, 50, *range(91, 102)]


@pytest.fixture(scope="module")
def packed_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("train-det") / "shards"
    pack_coco(str(COCO / "images"), str(COCO / "instances.json"), str(dst), drop_empty=True,
              options=PackOptions(max_count=8), workers=1)
    return dst


def _cfg(packed: Path, **kw: Any) -> DetectionBenchConfig:
    base: dict[str, Any] = {"images": str(COCO / "images"), "annotations": str(COCO / "instances.json"),
                            "shards": str(packed), "model": MODEL, "size": 64, "max_size": 96, "batch_size": 2,
                            "workers": 0, "steps": 1, "warmup": 0, "repeats": 1, "device": "cpu", "compile": False,
                            "contenders": ("cocodetection", "shardloader"), "settle_s": 0}
    return DetectionBenchConfig(**{**base, **kw})


def _step() -> DetectionStep:
    return DetectionStep(MODEL, len(CATEGORY_IDS) + 1, torch.device("cpu"), min_size=64, max_size=96, compile=False)


def test_report_has_every_run_of_every_contender_and_share_is_fed_over_synthetic(packed_coco: Path) -> None:
    order: list[tuple[str, int]] = []
    cfg = _cfg(packed_coco, contenders=("shardloader_cpu", "cocodetection", "shardloader"), repeats=2)
    report = run_detection_train_bench(cfg, after_run=lambda name, rep, _run: order.append((name, rep)))
    names = ["cocodetection", "shardloader", "shardloader_cpu"]
    assert order == [*((n, 0) for n in names), *((n, 1) for n in reversed(names))]  # alternating
    assert report["schema"] == "shardkit.bench.train_detection/1"
    check_runs(report, names, repeats=2)
    assert report["conditions"]["data"]["category_ids"] == CATEGORY_IDS
    table = format_detection_table(report)
    assert f"detection training step: {MODEL}, shorter side 64 px (longer at most 96)" in table
    assert "torchvision CocoDetection + DataLoader" in table and "ShardLoader (COCO route, CPU)" in table
    json.dumps(report)  # JSON-able


def test_a_bench_stopped_in_a_run_reports_the_runs_it_finished(packed_coco: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the second of four runs: the report of the first (cocodetection's), no row for
    shardloader, which finished none."""
    from shardkit.bench.finished import Interrupted

    stop_in_run(monkeypatch, 2)
    with pytest.raises(Interrupted) as caught:
        run_detection_train_bench(_cfg(packed_coco, repeats=2))
    report = caught.value.report
    assert report is not None and report["schema"] == train_detection.SCHEMA
    assert report["interrupted"] == {"runs_finished": 1, "runs_planned": 4, "not_run": ["shardloader"]}
    check_runs(report, ["cocodetection"], repeats=1)
    assert format_detection_table(report).splitlines()[1] == (
        "interrupted after 1 of 4 runs: the table holds the finished runs (not run: shardloader)")


def test_every_contender_gives_the_model_labels_1_to_k(packed_coco: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CocoDetection yields COCO category ids (up to 101 here): the step maps them to ShardLoader's 1..15.
    The step only records what the model would get."""
    seen: list[int] = []

    def recording(self: DetectionStep, images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]) -> None:
        seen.extend(label for t in targets for label in t["labels"].tolist())

    monkeypatch.setattr(DetectionStep, "__call__", recording)
    labels: dict[str, set[int]] = {}

    def after_run(name: str, _rep: int, _run: Any) -> None:
        labels[name] = set(seen)
        seen.clear()

    run_detection_train_bench(_cfg(packed_coco), after_run=after_run)
    assert set(labels) == {"cocodetection", "shardloader"}
    for name, got in labels.items():
        assert got and got <= set(range(1, len(CATEGORY_IDS) + 1)), (name, got)


def test_the_step_maps_category_ids_and_trains_on_images_without_boxes() -> None:
    step = _step()
    images = [torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8), torch.zeros(3, 64, 64, dtype=torch.uint8)]
    targets = [{"boxes": torch.tensor([[1.0, 2.0, 30.0, 40.0], [5.0, 5.0, 20.0, 20.0], [0.0, 0.0, 9.0, 9.0]]),
                "labels": torch.tensor([1, 17, 101]), "image_id": 3},
               {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64), "image_id": 4}]
    assert step.to_device((images, targets))[1][0]["labels"].tolist() == [1, 17, 101]  # already labels: as they are
    raw = step.reading_category_ids({cid: k + 1 for k, cid in enumerate(CATEGORY_IDS)})
    assert raw.net is step.net and raw.opt is step.opt  # the same model trains on every contender's batches
    on_device, on_targets = raw.to_device((images, targets, ["k3", "k4"]))
    assert on_targets[0]["labels"].tolist() == [1, 2, 15] and set(on_targets[0]) == {"boxes", "labels"}
    assert on_targets[1]["boxes"].shape == (0, 4)
    before = [p.detach().clone() for p in step.net.parameters()]
    raw(*raw.clone((on_device, on_targets)))
    assert any(not torch.equal(a, b) for a, b in zip(before, step.net.parameters(), strict=True))
    with pytest.raises(ValueError, match="category id 2 is not among"):
        raw.to_device((images[:1], [{"boxes": torch.zeros(1, 4), "labels": torch.tensor([2])}]))


def test_settings_and_data_are_checked(packed_coco: Path, tiny_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        run_detection_train_bench(_cfg(packed_coco, model="resnet50"))
    with pytest.raises(ValueError, match="contenders must be among"):
        run_detection_train_bench(_cfg(packed_coco, contenders=("imagefolder",)))
    with pytest.raises(ValueError, match="max_size must be >= size"):
        run_detection_train_bench(_cfg(packed_coco, size=128))
    with pytest.raises(ValueError, match="no full batch of 64"):
        run_detection_train_bench(_cfg(packed_coco, batch_size=64))
    other = tmp_path / "imagefolder-shards"
    pack(str(tiny_tree), str(other), workers=1)
    with pytest.raises(ValueError, match=r"not be on the same data \(pack its annotated images: .* --drop-empty\)$"):
        run_detection_train_bench(_cfg(other))


def _bench(*args: str) -> Any:
    return CliRunner().invoke(cli, ["bench", str(COCO / "images"), *args])


def test_cli_prints_the_table(packed_coco: Path, tmp_path: Path) -> None:
    out = tmp_path / "det.json"
    ok = _bench("--annotations", str(COCO / "instances.json"), "--shards", str(packed_coco), "--train", MODEL,
                "--size", "64", "--max-size", "96", "--batch-size", "2", "--workers", "0", "--steps", "1",
                "--warmup", "0", "--repeats", "1", "--out", str(out))
    assert ok.exit_code == 0, ok.output
    assert re.search(r"cocodetection +run 1/1: fed", ok.output)  # the per-run lines (stderr, mixed in here)
    assert "detection training step" in ok.output and "share" in ok.output
    assert "torchvision CocoDetection + DataLoader" in ok.output and "ShardLoader (COCO route)" in ok.output
    report = json.loads(out.read_text())
    assert report["schema"] == train_detection.SCHEMA
    assert report["config"]["contenders"] == ["cocodetection", "shardloader"]  # the CPU default


def test_cli_refuses_a_model_that_does_not_fit_the_data(packed_coco: Path, tiny_tree: Path) -> None:
    annotations = ("--annotations", str(COCO / "instances.json"))
    classifier = _bench(*annotations, "--shards", str(packed_coco), "--train", "resnet18")
    assert classifier.exit_code == 2 and "--train resnet18 is a classifier" in classifier.output
    detector = CliRunner().invoke(cli, ["bench", str(tiny_tree), "--train", MODEL])
    assert detector.exit_code == 2 and f"--train {MODEL} is a detector: it needs --annotations" in detector.output
    no_shards = _bench(*annotations, "--train", MODEL)
    assert no_shards.exit_code == 2 and "--train needs --shards naming a packed dataset of the COCO" in no_shards.output
    wrong = _bench(*annotations, "--shards", str(packed_coco), "--train", MODEL, "--contender", "imagefolder",
                   "--contender", "shardloader")
    assert wrong.exit_code == 2
    assert f"--contender imagefolder does not feed --train {MODEL}; its loaders: cocodetection," in wrong.output
    wrong = CliRunner().invoke(cli, ["bench", str(tiny_tree), "--train", "resnet18", "--contender", "cocodetection"])
    assert wrong.exit_code == 2 and "--contender cocodetection does not feed --train resnet18" in wrong.output
