"""The training recipe runs on CPU and resumes from its checkpoint at the right step."""

from __future__ import annotations

from pathlib import Path

import torch

from pipelines.train_classifier import main


def test_train_then_resume(tmp_path: Path, capsys, packed_sample: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    common = [str(packed_sample), "--batch-size", "8", "--size", "32", "--workers", "0", "--device",
              "cpu", "--checkpoint", str(ckpt)]
    main([*common, "--steps", "3"])
    assert torch.load(ckpt)["loader"]["batches_consumed"] == 3
    main([*common, "--steps", "5"])
    state = torch.load(ckpt)
    assert state["step"] == 5 and state["loader"]["batches_consumed"] == 5
    assert "step 5" in capsys.readouterr().out


def test_reports_the_fed_step_share(tmp_path: Path, capsys, packed_sample: Path) -> None:
    result = main([str(packed_sample), "--batch-size", "8", "--size", "32", "--workers", "0", "--device", "cpu",
                   "--steps", "4", "--share-steps", "2"])
    share = result["step_share"]
    assert share["share"] == share["fed_images_per_second"] / share["synthetic_images_per_second"] > 0
    assert f"fed-step share {share['share']:.0%}" in capsys.readouterr().out
