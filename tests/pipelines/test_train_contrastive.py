"""The contrastive (CLIP-style) recipe trains on packed captions on the CPU and resumes from its
checkpoint at the right step; its loss rewards matching pairs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pipelines.train_contrastive import contrastive_loss, main
from shardkit.pack import PackOptions, pack_captions
from shardkit.transforms import ByteTokenizer
from tests.trees import make_caption_folder


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pairs")
    make_caption_folder(root / "src", classes=2, per_class=2)
    pack_captions(str(root / "src"), str(root / "ds"), options=PackOptions(max_count=5), workers=1)
    return root / "ds"


def test_train_then_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str], pairs: Path) -> None:
    ckpt = tmp_path / "clip.pt"
    common = [str(pairs), "--batch-size", "2", "--size", "32", "--dim", "16", "--arch", "mobilenet_v3_small",
              "--context-length", "12", "--workers", "0", "--device", "cpu", "--epochs", "2", "--checkpoint", str(ckpt)]
    first = main([*common, "--steps", "1"])
    assert math.isfinite(first["loss"]) and torch.load(ckpt)["loader"]["batches_consumed"] == 1
    main([*common, "--steps", "3"])  # 2 batches an epoch: the resumed run ends one into the next epoch
    state = torch.load(ckpt)
    assert state["step"] == 3 and state["loader"]["epoch"] == 1 and state["loader"]["batches_consumed"] == 1
    assert "resumed from" in capsys.readouterr().out


def test_the_loss_rewards_matching_pairs() -> None:
    embeddings = torch.eye(4)  # four orthogonal unit vectors
    scale = torch.tensor(math.log(100.0))
    matched = contrastive_loss(embeddings, embeddings, scale)
    swapped = contrastive_loss(embeddings, embeddings[[1, 0, 3, 2]], scale)
    assert matched.item() < 1e-6 and swapped.item() > 50  # each image's caption is another's
    assert ByteTokenizer(4)(["hé", ""]).tolist() == [[105, 196, 170, 0], [0, 0, 0, 0]]
