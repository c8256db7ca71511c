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
