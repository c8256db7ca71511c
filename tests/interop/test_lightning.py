"""PyTorch Lightning DDP on two CPU ranks (gloo) running pipelines/lightning_recipe.py, the code
docs/guides/lightning.md shows: a loader built before ``trainer.fit`` trains each rank on its own
share (it used to read the whole epoch on both ranks, then gloo failed), and a validation loop
that drops padding with ``real_samples(batch_idx)`` counts each sample once."""

from __future__ import annotations

from pathlib import Path

import pytest

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
