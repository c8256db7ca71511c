"""The detection recipe trains a few steps in one process on CPU on the packed COCO sample and resumes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pipelines.train_detector import main
from shardkit.pack import PackOptions, pack_coco
from tests.loader.coco_helpers import gpu_route_on_cpu

COCO = Path(__file__).resolve().parents[2] / "sample_data" / "coco"


@pytest.fixture(scope="module")
def packed_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("coco") / "ds"
    pack_coco(str(COCO / "images"), str(COCO / "instances.json"), str(dst), options=PackOptions(max_count=8), workers=1)
    return dst


def test_train_then_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_coco: Path) -> None:
    ckpt = tmp_path / "det.pt"
    common = [str(packed_coco), "--batch-size", "2", "--min-size", "64", "--max-size", "128", "--workers", "0",
              "--device", "cpu", "--checkpoint", str(ckpt)]
    main([*common, "--steps", "2"])
    state = torch.load(ckpt)
    assert state["step"] == 2 and state["loader"]["batches_consumed"] == 2
    assert state["model"]["roi_heads.box_predictor.cls_score.bias"].shape == (16,)  # 15 categories + background
    main([*common, "--steps", "3"])
    state = torch.load(ckpt)
    assert state["step"] == 3 and state["loader"]["batches_consumed"] == 3
    out = capsys.readouterr().out
    assert "step 3" in out and math.isfinite(float(out.split("loss")[-1].split()[0]))


def test_reports_the_fed_step_share(capsys: pytest.CaptureFixture[str], packed_coco: Path) -> None:
    result = main([str(packed_coco), "--batch-size", "2", "--min-size", "64", "--max-size", "128", "--workers", "0",
                   "--device", "cpu", "--steps", "3", "--share-steps", "2"])
    share = result["step_share"]
    assert share["share"] == share["fed_images_per_second"] / share["synthetic_images_per_second"] > 0
    assert f"fed-step share {share['share']:.0%}" in capsys.readouterr().out


def test_trains_and_resumes_on_the_coco_gpu_route(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  packed_coco: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``--device cuda`` runs (the COCO GPU route: list batches, targets as the CPU route's),
    here with the route's device stages on the CPU; training and evaluation loaders both take it."""
    routes = gpu_route_on_cpu(monkeypatch)
    ckpt = tmp_path / "det.pt"
    common = [str(packed_coco), "--val", str(packed_coco), "--batch-size", "2", "--min-size", "64", "--max-size",
              "128", "--workers", "1", "--device", "cpu", "--checkpoint", str(ckpt), "--epochs", "1"]
    main([*common, "--steps", "2"])
    assert len(routes) == 2  # training and validation
    assert torch.load(ckpt)["loader"]["batches_consumed"] == 2
    main([*common, "--steps", "3"])
    state = torch.load(ckpt)
    assert state["step"] == 3 and state["loader"]["batches_consumed"] == 3
    assert math.isfinite(float(capsys.readouterr().out.split("loss")[-1].split()[0]))


def test_evaluating_a_classifier_on_coco_shards_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str],
                                                                           packed_coco: Path, tmp_path: Path) -> None:
    from pipelines.evaluate_classifier import main as evaluate_classifier

    with pytest.raises(SystemExit) as exit_:
        evaluate_classifier([str(packed_coco), "--device", "cpu", "--workers", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "error:" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_:
        evaluate_classifier([str(packed_coco), "--device", "cpu", "--checkpoint", str(tmp_path / "none.pt")])
    assert exit_.value.code == 2 and "none.pt: no such file" in capsys.readouterr().err


def test_a_checkpoint_in_a_folder_not_made_yet(tmp_path: Path, packed_coco: Path) -> None:
    ckpt = tmp_path / "runs" / "det" / "ck.pt"
    main([str(packed_coco), "--batch-size", "2", "--min-size", "64", "--max-size", "128", "--workers", "0",
          "--device", "cpu", "--steps", "1", "--checkpoint", str(ckpt)])
    assert torch.load(ckpt)["step"] == 1
