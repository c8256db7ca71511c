"""Hostile or foreign resume states are refused at once (no work in proportion to them), in one
line: numbers past int64, a world size of millions, and a state saved on another dataset whose
shards have the same sizes (the state is bound to the shards' hashes, not their sizes)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from shardkit import ShardLoader
from shardkit.errors import LoaderError
from shardkit.index import write_table
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.state import MAX_WORLD_SIZE, LoaderState
from shardkit.storage import Store


def _plan(**changes: object) -> PlanConfig:
    args: dict[str, object] = dict(shard_sizes=[60, 40], seed=1, shuffle=True, window=8, rank=0, world_size=2,
                                   batch_size=8, drop_last=False, dataset="0123456789abcdef")
    return PlanConfig(**{**args, **changes})  # type: ignore[arg-type]


def _state(**changes: object) -> dict[str, object]:
    return {**_plan().state(3, 2).to_dict(), **changes}



#: What "at once" allows: far under what work in proportion to a number past its range (a loop to
#: 2**63, a world of 10**7 ranks) takes, far over a loaded CI box's time for the checks themselves.
QUICK_S = 5.0

@pytest.mark.parametrize(("key", "value"), [
    ("epoch", 2**63), ("epoch", 2**63 - 1), ("batches_consumed", 10**5000), ("num_samples", 2**64),
    ("seed", 2**64), ("world_size", 10**7),
], ids=["epoch-2**63", "epoch-2**63-1", "5000-digits", "samples-2**64", "seed-2**64", "world-10**7"])
def test_numbers_past_their_range_are_refused_at_once(key: str, value: int) -> None:
    t0 = time.perf_counter()
    with pytest.raises(LoaderError, match=f"loader state: {key} must be below"):
        _plan().resume(_state(**{key: value}))
    assert time.perf_counter() - t0 < QUICK_S


def test_an_elastic_resume_from_the_most_ranks_a_state_may_name_is_quick() -> None:
    state = _state(world_size=MAX_WORLD_SIZE, batches_consumed=0, epoch=0)
    t0 = time.perf_counter()
    assert _plan().resume(state)[:2] == (0, 0)
    assert time.perf_counter() - t0 < QUICK_S


def test_a_state_of_another_dataset_with_equal_shard_sizes_is_refused() -> None:
    state = _state()
    assert state["dataset"] == "0123456789abcdef"
    with pytest.raises(LoaderError, match="made for another dataset: its shards' hashes differ"):
        _plan(dataset="fedcba9876543210").resume(state)
    old = {k: v for k, v in state.items() if k != "dataset"}  # saved before states named their dataset
    assert _plan(dataset="fedcba9876543210").resume(old)[0] == 3
    with pytest.raises(LoaderError, match="dataset must be 16 lower-case hex digits"):
        LoaderState.from_dict({**state, "dataset": "../x"})


def test_the_loader_binds_its_state_to_the_shards_hashes(packed: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(packed, other)
    index = json.loads((other / "index.json").read_bytes())
    index["shards"][0]["sha256"] = "0" * 64  # same sizes, other contents (as another dataset's)
    del index["table"]
    (other / "index.json").write_text(json.dumps(index))
    write_table(Store(str(other)))  # its own table: the identity comes from the table's hash blocks
    state = ShardLoader(str(packed), batch_size=8, num_workers=0).state_dict()
    with pytest.raises(LoaderError, match="made for another dataset"):
        ShardLoader(str(other), batch_size=8, num_workers=0).load_state_dict(state)
    ShardLoader(str(packed), batch_size=8, num_workers=0).load_state_dict(state)
