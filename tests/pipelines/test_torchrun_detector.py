"""The detection recipes for real under torchrun: two CPU ranks (gloo), a preemption (SIGKILL)
mid-epoch, a resume from the last checkpoint, and a COCO mAP evaluation that sees each image once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from sample_data.coco_gen import make_coco
from shardkit import ShardLoader
from shardkit.pack import PackOptions, pack_coco
from tests.pipelines.test_torchrun import keys_across_kill, torchrun

WORLD, BATCH = 2, 2
SIZES = ["--min-size", "48", "--max-size", "96"]  # small: a CPU step in well under a second


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train: 24 images (6 steps of 2 ranks x 2, nothing dropped); val: 9 (5 batches of 2, the
    last of 1, so the ranks hold 2 and 3 batches). Generated COCO: crowd RLE, images without
    boxes, non-contiguous category ids."""
    root = tmp_path_factory.mktemp("torchrun-coco")
    out = {}
    for name, images, seed in (("train", 24, 1), ("val", 9, 2)):
        images_dir, ann = make_coco(root / f"{name}-src", images=images, seed=seed)
        pack_coco(str(images_dir), str(ann), str(root / name), options=PackOptions(max_count=5, seed=1), workers=1)
        out[name], out[f"{name}-annotations"] = root / name, ann
    return out


def all_keys(dataset: Path) -> list[str]:
    return sorted(k for *_, keys in ShardLoader(str(dataset), batch_size=8, shuffle=False, even_batches=False,
                                                     keys=True) for k in keys)


def test_killed_mid_epoch_then_resumed_trains_on_each_image_once(packed: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "det.pt"
    common = [str(packed["train"]), "--epochs", "1", "--batch-size", str(BATCH), *SIZES, "--workers", "0",
              "--device", "cpu", "--checkpoint", str(ckpt), "--checkpoint-every", "2", "--log-every", "1"]
    killed = torchrun("train_detector.py", *common, "--stop-after-steps", "5", "--log-keys", str(tmp_path / "a"))
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert "step 4  epoch 0  loss" in killed.stdout and "data wait" in killed.stdout  # past the step-4 checkpoint
    saved = torch.load(ckpt)
    assert saved["step"] == 4 and saved["loader"]["batches_consumed"] == 4 and saved["loader"]["epoch"] == 0
    assert saved["label_map"] == {1: 1, 3: 2, 18: 3, 90: 4} and saved["num_classes"] == 5
    assert saved["model"]["roi_heads.box_predictor.cls_score.bias"].shape == (5,)  # 4 categories + background

    resumed = torchrun("train_detector.py", *common, "--val", str(packed["val"]), "--log-keys", str(tmp_path / "b"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step 4, epoch 0, 2 of its 6 batches to go" in resumed.stdout
    assert re.search(r"epoch 0  bbox AP [0-9.]+  AP50 [0-9.]+  AP75 [0-9.]+  \(9 images over 2 ranks",
                     resumed.stdout), resumed.stdout
    assert torch.load(ckpt)["step"] == 6

    every = keys_across_kill(tmp_path, packed["train"], saved["step"], world=WORLD, batch=BATCH)
    assert sorted(every) == all_keys(packed["train"]) and len(every) == 24  # one epoch: each image exactly once


def test_evaluation_scores_each_image_once(packed: dict[str, Path], tmp_path: Path) -> None:
    done = torchrun("evaluate_detector.py", str(packed["val"]), "--batch-size", str(BATCH), *SIZES,
                    "--workers", "1", "--device", "cpu", "--log-keys", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    batches = [(tmp_path / f"eval-rank{r}.txt").read_text().splitlines() for r in range(WORLD)]
    assert sorted(len(b) for b in batches) == [2, 3]  # ranks differ by one batch; no padding
    sizes = sorted(len(line.split()) for b in batches for line in b)
    assert sizes == [1] + [BATCH] * 4  # one short batch
    assert sorted(k for b in batches for line in b for k in line.split()) == all_keys(packed["val"])
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all" in done.stdout  # COCOeval's table
    match = re.search(r"bbox AP [0-9.]+  AP50 [0-9.]+  AP75 [0-9.]+  \((\d+) images over 2 ranks, (\d+) boxes",
                      done.stdout)
    assert match and int(match[1]) == 9, done.stdout
    boxes = len(json.loads((packed["val-annotations"]).read_text(encoding="utf-8"))["annotations"])
    assert int(match[2]) == boxes  # every ground-truth box of every image, crowd ones too, once
