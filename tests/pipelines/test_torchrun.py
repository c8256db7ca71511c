"""The recipes for real under torchrun: two CPU ranks (gloo), a preemption (SIGKILL) mid-epoch,
a resume from the last checkpoint, and an evaluation that counts each sample once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardkit import ShardLoader
from tests.trees import packed_train_val

ROOT = Path(__file__).resolve().parents[2]
WORLD, BATCH = 2, 4


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train: 48 samples (6 steps of 2 ranks x 4, nothing dropped); val: 42 (11 batches of 4, the
    last of 2: 5 on rank 0, 6 on rank 1). Keys are the index in ImageFolder order."""
    root = tmp_path_factory.mktemp("torchrun")
    return packed_train_val(root)


def torchrun(script: str, *args: str, nproc: int = WORLD) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "--max_restarts", "0", str(ROOT / "pipelines" / script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def read_log(path: Path) -> list[tuple[int, list[str]]]:
    """``(step, keys)`` per line of a ``--log-keys`` training log."""
    return [(int(line.split()[0]), line.split()[1:]) for line in path.read_text().splitlines()]


def keys_across_kill(logs: Path, dataset: Path, checkpoint_step: int, *, world: int, batch: int) -> list[str]:
    """Check, per rank, that the keys trained up to the checkpoint (killed run, ``logs/a``) plus
    those of the resumed run (``logs/b``) are that rank's uninterrupted epoch 0; return them all."""
    every: list[str] = []
    for rank in range(world):
        before = read_log(logs / "a" / f"train-rank{rank}.txt")
        after = read_log(logs / "b" / f"train-rank{rank}.txt")
        assert [s for s, _ in before][:4] == [1, 2, 3, 4] and [s for s, _ in after] == [5, 6]
        kept = [keys for step, keys in before if step <= checkpoint_step]  # steps after the checkpoint are redone
        seen = [k for keys in kept + [keys for _, keys in after] for k in keys]
        reference = ShardLoader(str(dataset), batch_size=batch, rank=rank, world_size=world, drop_last=True,
                                keys=True)  # the uninterrupted epoch 0 of this rank
        assert seen == [k for *_, keys in reference for k in keys]
        every += seen
    return every


def train_arguments(dataset: Path, ckpt: Path) -> list[str]:
    """One epoch of batches of BATCH on the CPU, a checkpoint every 2 steps, every step logged."""
    return [str(dataset), "--epochs", "1", "--batch-size", str(BATCH), "--size", "32", "--workers", "0",
            "--device", "cpu", "--arch", "squeezenet1_1", "--checkpoint", str(ckpt), "--checkpoint-every", "2",
            "--log-every", "1"]


def kill_after_step_five(common: list[str], logs: Path) -> subprocess.CompletedProcess[str]:
    """Train on WORLD ranks until the job dies after step 5 (checkpoint at step 4), keys in ``logs``."""
    killed = torchrun("train_classifier.py", *common, "--stop-after-steps", "5", "--log-keys", str(logs))
    assert killed.returncode != 0, killed.stderr[-3000:]
    return killed


def test_killed_mid_epoch_then_resumed_trains_on_each_sample_once(packed: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    common = train_arguments(packed["train"], ckpt)
    killed = kill_after_step_five(common, tmp_path / "a")
    assert "step 4  epoch 0" in killed.stdout  # it trained past the checkpoint at step 4, then died
    import torch

    saved = torch.load(ckpt)
    assert saved["step"] == 4 and saved["loader"]["batches_consumed"] == 4 and saved["loader"]["epoch"] == 0

    resumed = torchrun("train_classifier.py", *common, "--val", str(packed["val"]), "--log-keys", str(tmp_path / "b"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step 4, epoch 0, 2 of its 6 batches to go" in resumed.stdout
    assert "epoch 0  top-1" in resumed.stdout and "/42)" in resumed.stdout  # val: each of 42 samples once
    assert torch.load(ckpt)["step"] == 6

    every = keys_across_kill(tmp_path, packed["train"], saved["step"], world=WORLD, batch=BATCH)
    assert sorted(every) == [f"{i:08d}" for i in range(48)]  # one epoch: each sample exactly once


def test_a_job_preempted_on_two_ranks_resumes_on_one(packed: dict[str, Path], tmp_path: Path) -> None:
    """Elastic resume under torchrun: the checkpoint of 2 ranks x 4 (step 4: 32 samples trained)
    resumes on 1 rank x 4, which trains on the 16 samples no rank had reached: the epoch's 48
    samples exactly once over both runs."""
    ckpt = tmp_path / "ckpt.pt"
    common = train_arguments(packed["train"], ckpt)
    kill_after_step_five(common, tmp_path / "a")
    resumed = torchrun("train_classifier.py", *common, "--log-keys", str(tmp_path / "b"), nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step 4, epoch 0, 4 of its 12 batches to go" in resumed.stdout
    before = [keys for r in range(WORLD) for step, keys in read_log(tmp_path / "a" / f"train-rank{r}.txt")
              if step <= 4]  # steps after the checkpoint are redone
    after = [keys for _, keys in read_log(tmp_path / "b" / "train-rank0.txt")]
    assert len(after) == 4  # 16 samples left, one rank of 4
    every = [k for keys in before + after for k in keys]
    assert sorted(every) == [f"{i:08d}" for i in range(48)]  # one epoch: each sample exactly once


def test_evaluation_counts_each_sample_once(packed: dict[str, Path], tmp_path: Path) -> None:
    done = torchrun("evaluate_classifier.py", str(packed["val"]), "--arch", "squeezenet1_1", "--batch-size",
                    str(BATCH), "--size", "32", "--workers", "1", "--device", "cpu", "--log-keys", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    batches = [(tmp_path / f"eval-rank{r}.txt").read_text().splitlines() for r in range(WORLD)]
    assert [len(b) for b in batches] == [5, 6]  # ranks differ by one batch; no padding
    sizes = [len(line.split()) for b in batches for line in b]
    assert sizes == [BATCH] * 10 + [2]  # the last batch is short
    assert sorted(k for b in batches for line in b for k in line.split()) == [f"{i:08d}" for i in range(42)]
    match = re.search(r"top-1 [0-9.]+ \((\d+)/(\d+) samples over 2 ranks", done.stdout)
    assert match and int(match[2]) == 42, done.stdout
