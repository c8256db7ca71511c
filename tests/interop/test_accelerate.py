"""HF accelerate under torchrun (two CPU ranks, gloo) running pipelines/accelerate_recipe.py, the
code docs/guides/accelerate.md shows: gradient accumulation steps at each epoch's last batch, and
an evaluation that gathers per batch counts each sample once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.interop.conftest import run_script

pytest.importorskip("accelerate")


@pytest.mark.slow
def test_accelerate_accumulates_to_the_epoch_end_and_gathers_each_sample_once(frames: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    done = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max_restarts", "0",
                      "pipelines/accelerate_recipe.py", str(frames["train"]), str(frames["val"]), str(result))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "waits forever" not in done.stderr, done.stderr[-4000:]  # its evaluation: under no_grad, as advised
    out = json.loads(result.read_text())
    assert out["world"] == 2
    # 6 batches per rank, accumulation over 4: a step at batch 3 and at the epoch's last (5), each epoch;
    # without the end signal the last two micro-batches rolled into the next epoch ([3], [1, 5])
    assert out["stepped"] == [[3, 5], [3, 5]]
    # 42 samples, 21 per class: 48 gathered slots of which the 6 padding ones are dropped
    assert out["per_batch"] == {"total": 42, "per_class": [21, 21]}
    assert out["once"] == {"total": 42, "per_class": [21, 21]}


def test_an_iterator_left_open_at_exit_under_an_accelerator_ends_without_a_word(frames: dict[str, Path]) -> None:
    """A script that peeks at one batch (``next(iter(loader))``) and ends: the open iteration is
    closed after modules are torn down, and must not print "Exception ignored" from accelerate's
    bookkeeping then."""
    script = ("from accelerate import Accelerator\n"
              "from shardkit import ShardLoader, transforms\n"
              "acc = Accelerator(cpu=True)\n"
              f"loader = ShardLoader({str(frames['train'])!r}, batch_size=4, "
              "transform=transforms.imagenet_val(32, crop_fraction=1.0))\n"
              "batches = iter(loader)\n"
              "images, labels = next(batches)\n"
              "print(tuple(images.shape))\n")
    done = run_script("-c", script)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "(4, 3, 32, 32)"
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-4000:]


@pytest.mark.slow
def test_an_accelerator_that_runs_its_process_alone_under_torchrun_is_refused(frames: dict[str, Path]) -> None:
    """A plain ``Accelerator()`` under ``torchrun`` without a GPU makes a gloo group of the two
    processes and still counts one: each trained its own model on half the data, no gradient
    shared, no word said. The loader refuses, saying what to build instead."""
    script = ("from accelerate import Accelerator\n"
              "from shardkit import ShardLoader\n"
              "acc = Accelerator()\n"
              f"loader = ShardLoader({str(frames['train'])!r}, batch_size=4)\n"
              "print(acc.num_processes, len(loader))\n")
    done = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max_restarts", "0",
                      "--no-python", sys.executable, "-c", script)
    assert done.returncode != 0
    assert "but accelerate runs it alone (Accelerator().num_processes is 1)" in done.stderr
    assert "Accelerator(cpu=True)" in done.stderr
