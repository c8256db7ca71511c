"""PyTorch Lightning DDP on two CPU ranks (gloo) running pipelines/lightning_recipe.py, the code
docs/guides/lightning.md shows: a loader built before ``trainer.fit`` trains each rank on its own
share (it used to read the whole epoch on both ranks, then gloo failed), and a validation loop
that drops padding with ``real_samples(batch_idx)`` counts each sample once; a fit resumed from
a checkpoint trains what an unbroken one trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardkit import ShardLoader
from tests.interop.conftest import run_script

pytest.importorskip("lightning")


@pytest.mark.slow
def test_lightning_ddp_with_a_loader_built_before_fit_trains_and_validates_each_sample_once(frames: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"  # made by the recipe, before it trains
    done = run_script("pipelines/lightning_recipe.py", str(frames["train"]), str(frames["val"]), str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [(out / f"rank{r}.txt").read_text().split() for r in range(2)]
    assert [len(keys) for keys in ranks] == [24, 24]  # 48 samples, 6 batches of 4 per rank
    assert not set(ranks[0]) & set(ranks[1]) and len(set(ranks[0] + ranks[1])) == 48
    assert (out / "val_total.txt").read_text().split() == ["42"]  # 48 slots at 2 ranks x 6 x 4, 6 padding


_LOOK_THEN_FIT = """
import sys
from pathlib import Path

import lightning as L
import torch

from shardkit import ShardLoader

train_dir, out = sys.argv[1], Path(sys.argv[2])
loader = ShardLoader(train_dir, batch_size=4, keys=True, num_workers=1, shuffle=True, seed=1)
images, labels, keys = next(iter(loader))  # a look at the shapes before fit, at rank 0 of 1


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[str] = []

    def training_step(self, batch, batch_idx):
        self.seen += list(batch[2])
        return self.layer(torch.ones(1, 1)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        (out / f"rank{self.global_rank}.txt").write_text(" ".join(self.seen))


out.mkdir(exist_ok=True)
L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False).fit(Model(), loader)
"""


@pytest.mark.slow
def test_a_look_at_a_batch_before_fit_leaves_each_rank_its_own_share(frames: dict[str, Path], tmp_path: Path) -> None:
    """``next(iter(loader))`` before ``trainer.fit`` iterated the loader as rank 0 of 1, and fit
    then failed on both ranks (the world had changed after iteration began)."""
    script = tmp_path / "look_then_fit.py"
    script.write_text(_LOOK_THEN_FIT)
    done = run_script(str(script), str(frames["train"]), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [(tmp_path / "out" / f"rank{r}.txt").read_text().split() for r in range(2)]
    assert [len(keys) for keys in ranks] == [24, 24] and len(set(ranks[0] + ranks[1])) == 48


_RESUME = """
import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from shardkit import ShardLoader

train_dir, val_dir, out, name, epochs = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
ckpt = sys.argv[6] if len(sys.argv) > 6 else None


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[str]] = {}
        self.validated: dict[int, list[str]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(batch[2])
        return self.layer(torch.ones(1, 1)).sum()

    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            self.validated.setdefault(self.current_epoch, []).extend(batch[2])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        (out / f"{name}.json").write_text(json.dumps(self.seen))
        (out / f"{name}_val.json").write_text(json.dumps(self.validated))


train = ShardLoader(train_dir, batch_size=4, keys=True, num_workers=1, seed=1)
val = ShardLoader(val_dir, batch_size=4, keys=True)  # shuffled: each validation is the fit's epoch's order
saves = [ModelCheckpoint(dirpath=out / "ends", save_top_k=-1),  # at each epoch's end, Lightning's default
         ModelCheckpoint(dirpath=out / "steps", save_top_k=-1, every_n_train_steps=5)]
L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False, callbacks=saves, enable_progress_bar=False,
          enable_model_summary=False).fit(Model(), train, val, ckpt_path=ckpt)
"""


@pytest.mark.slow
def test_fit_resumed_from_a_checkpoint_at_an_epochs_end_or_mid_epoch_trains_what_an_unbroken_fit_trains(
        frames: dict[str, Path], tmp_path: Path) -> None:
    """Lightning loads no loader state from a checkpoint taken at an epoch's end; it gives the
    epoch to ``loader.sampler.set_epoch``. A ShardLoader without ``sampler`` started its own epoch
    0 again after such a resume, and every later epoch one behind."""
    script = tmp_path / "resume.py"
    script.write_text(_RESUME)
    data = (str(frames["train"]), str(frames["val"]), str(tmp_path))

    with ShardLoader(str(frames["val"]), batch_size=4, keys=True) as val:  # the validations' orders
        val_epochs = {}
        for epoch in range(3):
            val.set_epoch(epoch)
            val_epochs[str(epoch)] = [key for *_, keys in val for key in keys]

    def fit(name: str, *ckpt: str) -> dict[str, list[str]]:
        done = run_script(str(script), *data, name, "3", *ckpt)
        assert done.returncode == 0, done.stderr[-4000:]
        assert "drops its resume point" not in done.stderr, done.stderr[-4000:]
        seen: dict[str, list[str]] = json.loads((tmp_path / f"{name}.json").read_text())
        # the sanity check's two batches leave the validation of epoch 0 open; set_epoch(0) still runs epoch 0
        validated = json.loads((tmp_path / f"{name}_val.json").read_text())
        assert validated == {epoch: val_epochs[epoch] for epoch in seen}, name
        return seen

    whole = fit("whole")  # 48 samples, 12 batches an epoch: checkpoints at steps 5, 10, 12 (end), 15, 20, ...
    assert [len(whole[e]) for e in "012"] == [48] * 3 and whole["0"] != whole["1"] != whole["2"]
    ended = fit("ended", str(tmp_path / "ends" / "epoch=0-step=12.ckpt"))
    assert ended == {"1": whole["1"], "2": whole["2"]}
    midway = fit("midway", str(tmp_path / "steps" / "epoch=1-step=20.ckpt"))  # 8 of epoch 1's 12 batches done
    assert midway == {"1": whole["1"][32:], "2": whole["2"]}
