"""The detection recipe trains a few steps in one process on CPU on the packed COCO sample and resumes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pipelines import evaluate_detector
from pipelines.train_detector import main
from shardkit.pack import PackOptions, pack_coco
from tests.loader.coco_helpers import gpu_route_on_cpu
from tests.pipelines.conftest import refused

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


def test_sizes_or_an_arch_that_cannot_work_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            packed_coco: Path) -> None:
    """Said before any data is read: torchvision's resize refused --max-size under --min-size at the
    first evaluation, after the training, and an --arch beside a checkpoint was dropped. Equal sizes
    are taken, as torchvision's detection models take them (they were refused)."""
    err = refused(main, [str(packed_coco), "--min-size", "256", "--max-size", "128", "--device", "cpu"], capsys)
    assert "--max-size 128 must not be below --min-size 256" in err
    evaluate = [str(packed_coco), "--device", "cpu", "--workers", "0"]
    equal = tmp_path / "equal.pt"
    main([str(packed_coco), "--batch-size", "2", "--min-size", "64", "--max-size", "64", "--workers", "0",
          "--device", "cpu", "--checkpoint", str(equal), "--steps", "1", "--val", str(packed_coco)])
    assert torch.load(equal)["step"] == 1
    ckpt = tmp_path / "det.pt"
    main([str(packed_coco), "--batch-size", "2", "--min-size", "64", "--max-size", "128", "--workers", "0",
          "--device", "cpu", "--checkpoint", str(ckpt), "--steps", "1"])
    err = refused(evaluate_detector.main, [*evaluate, "--checkpoint", str(ckpt), "--max-size", "32"], capsys)
    assert "--max-size 32 must not be below --min-size 64 (the checkpoint's sizes where not given)" in err
    err = refused(evaluate_detector.main, [*evaluate, "--checkpoint", str(ckpt), "--arch", "retinanet_resnet50_fpn"],
                  capsys)
    assert (f"--arch retinanet_resnet50_fpn: --checkpoint {ckpt} holds a fasterrcnn_mobilenet_v3_large_320_fpn "
            "model (leave --arch out, or give fasterrcnn_mobilenet_v3_large_320_fpn)") in err
    evaluate_detector.main([*evaluate, "--checkpoint", str(ckpt), "--arch", "fasterrcnn_mobilenet_v3_large_320_fpn"])
    assert "(25 images over 1 rank" in capsys.readouterr().out


def test_a_validation_set_of_other_categories_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  packed_coco: Path) -> None:
    """It ended the run with a bare message and exit status 1, without the recipe's name."""
    import json

    from tests.pipelines.conftest import SAMPLE

    coco = SAMPLE.parent / "coco"
    doc = json.loads((coco / "instances.json").read_text())
    doc["categories"] = [{**c, "id": c["id"] + 1000} for c in doc["categories"]]
    for ann in doc["annotations"]:
        ann["category_id"] += 1000
    (tmp_path / "other.json").write_text(json.dumps(doc))
    pack_coco(str(coco / "images"), str(tmp_path / "other.json"), str(tmp_path / "other"), workers=1)
    err = refused(main, [str(packed_coco), "--val", str(tmp_path / "other"), "--batch-size", "2", "--min-size", "64",
                         "--max-size", "128", "--workers", "0", "--device", "cpu", "--steps", "1"], capsys)
    assert ": error: --val " in err and "have different categories: labels would not match" in err, err
