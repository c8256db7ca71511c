"""The contrastive (CLIP-style) recipe trains on packed captions on the CPU and resumes from its
checkpoint at the right step; its loss rewards matching pairs."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
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
    resumed = main([*common, "--steps", "3", "--share-steps", "1"])  # 2 batches an epoch: ends one into the next
    state = torch.load(ckpt)
    assert state["step"] == 3 and state["loader"]["epoch"] == 1 and state["loader"]["batches_consumed"] == 1
    out = capsys.readouterr().out
    assert "resumed from" in out and "fed-step share" in out
    share = resumed["step_share"]  # the last step's rate over one synthetic step's
    assert share["fed_images_per_second"] > 0 and share["share"] == pytest.approx(
        share["fed_images_per_second"] / share["synthetic_images_per_second"])
    main([*common, "--steps", "3"])  # the same command again: it said only that it resumed
    assert "nothing to train: the checkpoint is at step 3, epoch 1 (--steps 3, --epochs 2)" in capsys.readouterr().out


def test_the_keys_log_and_the_preemption_option_are_taken(tmp_path: Path, pairs: Path) -> None:
    """--log-keys writes each step's keys, and --stop-after-steps kills the run after that step
    (both listed by --help, as in the other training recipes)."""
    common = [str(pairs), "--batch-size", "2", "--size", "32", "--dim", "16", "--arch", "mobilenet_v3_small",
              "--context-length", "12", "--workers", "0", "--device", "cpu", "--epochs", "1"]
    main([*common, "--log-keys", str(tmp_path / "keys")])
    lines = (tmp_path / "keys" / "train-rank0.txt").read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2"] and all(len(line.split()) == 3 for line in lines)
    script = Path(__file__).resolve().parents[2] / "pipelines" / "train_contrastive.py"
    killed = subprocess.run([sys.executable, str(script), *common, "--steps", "2", "--stop-after-steps", "1",
                             "--checkpoint-every", "0", "--checkpoint", str(tmp_path / "c.pt")],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (tmp_path / "c.pt").exists()  # killed after step 1, before the end's checkpoint


def test_the_loss_rewards_matching_pairs() -> None:
    embeddings = torch.eye(4)  # four orthogonal unit vectors
    scale = torch.tensor(math.log(100.0))
    matched = contrastive_loss(embeddings, embeddings, scale)
    swapped = contrastive_loss(embeddings, embeddings[[1, 0, 3, 2]], scale)
    assert matched.item() < 1e-6 and swapped.item() > 50  # each image's caption is another's
    assert ByteTokenizer(4)(["hé", ""]).tolist() == [[105, 196, 170, 0], [0, 0, 0, 0]]


def _ranks_gradient(rank: int, world: int, port: int, embeddings: torch.Tensor, out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = len(embeddings) // world
    image = embeddings[:, :4][rank * rows:(rank + 1) * rows].clone().requires_grad_()
    text = embeddings[:, 4:][rank * rows:(rank + 1) * rows].clone().requires_grad_()
    contrastive_loss(image, text, torch.tensor(0.0)).backward()  # scale e^0 = 1
    torch.save((image.grad, text.grad), out / f"grad{rank}.pt")
    dist.destroy_process_group()


def test_two_ranks_train_the_global_batch_loss(tmp_path: Path) -> None:
    """Two gloo ranks, each its half of the batch: the embeddings' gradients summed as DDP does are
    those of one process computing the same loss over the whole batch (its mean over the ranks)."""
    import socket

    import torch.multiprocessing as mp

    embeddings = torch.nn.functional.normalize(torch.randn(6, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_ranks_gradient, args=(2, port, embeddings, tmp_path), nprocs=2, start_method="fork")
    image, text = embeddings[:, :4].clone().requires_grad_(), embeddings[:, 4:].clone().requires_grad_()
    total = torch.zeros(())
    for start in (0, 3):  # each rank's loss: its rows against every rank's columns
        targets = torch.arange(start, start + 3)
        total = total + (torch.nn.functional.cross_entropy(image[start:start + 3] @ text.T, targets)
                         + torch.nn.functional.cross_entropy(text[start:start + 3] @ image.T, targets)) / 2
    total.backward()  # DDP averages the ranks' gradients of shared weights: the sum's gradient / 2
    assert image.grad is not None and text.grad is not None
    for rank, start in enumerate((0, 3)):
        image_grad, text_grad = torch.load(tmp_path / f"grad{rank}.pt")
        torch.testing.assert_close(image_grad, image.grad[start:start + 3])
        torch.testing.assert_close(text_grad, text.grad[start:start + 3])
