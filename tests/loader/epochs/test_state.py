"""LoaderState: JSON round trip, validation, and refusal of incompatible resumes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardkit.errors import LoaderError
from shardkit.loader.epochs.plan import num_batches
from shardkit.loader.epochs.state import LoaderState, check_compatible, shards_digest

CONFIG: dict[str, Any] = dict(
    seed=1,
    num_samples=100,
    shards_digest=shards_digest([60, 40]),
    world_size=2,
    batch_size=8,
    drop_last=False,
    shuffle=True,
    window=8,
)


ORDER = {k: CONFIG[k] for k in ("seed", "num_samples", "shards_digest", "shuffle", "window")}
ORDER["mix"] = None  # one dataset


def make(**changes: Any) -> LoaderState:
    return LoaderState(**{**CONFIG, "epoch": 3, "batches_consumed": 5, **changes})


@given(
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 10**6),
    world_size=st.integers(1, 8),
    batch_size=st.integers(1, 64),
    drop_last=st.booleans(),
    consumed=st.integers(0, 100),
)
def test_round_trips_through_json(seed, epoch, world_size, batch_size, drop_last, consumed):
    nb = num_batches(100, world_size=world_size, batch_size=batch_size, drop_last=drop_last)
    state = make(
        seed=seed,
        epoch=epoch,
        batches_consumed=min(consumed, nb),
        world_size=world_size,
        batch_size=batch_size,
        drop_last=drop_last,
    )
    assert LoaderState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_numpy_values_become_python_values():
    state = make(num_samples=np.int64(100), shuffle=np.bool_(True))
    assert type(state.num_samples) is int and type(state.shuffle) is bool
    json.dumps(state.to_dict())


def test_a_plan_version_1_state_is_refused_naming_the_plan_version():
    d = make().to_dict() | {"version": 1}
    with pytest.raises(LoaderError, match=r"state version 1.*plan version 1.*plan version 2"):
        LoaderState.from_dict(d)


@pytest.mark.parametrize("version", [0, 3, "2", None])
def test_unknown_version_is_refused(version):
    d = make().to_dict() | {"version": version}
    with pytest.raises(LoaderError, match="version"):
        LoaderState.from_dict(d)


@pytest.mark.parametrize(
    "bad",
    [
        {"epoch": "3"},
        {"epoch": 3.0},
        {"batch_size": True},
        {"shuffle": 1},
        {"shards_digest": 5},
        {"world_size": 0},
        {"seed": -1},
        {"batches_consumed": 8},  # an epoch of 100 samples on 2 ranks x 8 has 7 batches
    ],
)
def test_bad_values_are_refused(bad):
    with pytest.raises(LoaderError):
        LoaderState.from_dict(make().to_dict() | bad)


def test_missing_and_unknown_keys_are_refused():
    d = make().to_dict()
    with pytest.raises(LoaderError, match="missing"):
        LoaderState.from_dict({k: v for k, v in d.items() if k != "window"})
    with pytest.raises(LoaderError, match="unknown"):
        LoaderState.from_dict(d | {"rank": 0})
    with pytest.raises(LoaderError):
        LoaderState.from_dict([1, 2])  # type: ignore[arg-type]


def test_compatible_configuration_passes():
    check_compatible(make(), **ORDER)
    check_compatible(make(world_size=3, batch_size=4, drop_last=True, even_batches=False), **ORDER)  # elastic


@pytest.mark.parametrize(
    "change",
    [
        {"num_samples": 101},
        {"shuffle": False},
        {"seed": 2},
        {"window": 4},
        {"shards_digest": shards_digest([40, 60])},
    ],
)
def test_another_dataset_or_order_is_refused_naming_the_field(change):
    with pytest.raises(LoaderError, match=f"another dataset or order: {next(iter(change))}"):
        check_compatible(make(), **(ORDER | change))


def test_check_compatible_needs_every_field_the_order_depends_on():
    with pytest.raises(LoaderError, match="window"):
        check_compatible(make(), **{k: v for k, v in ORDER.items() if k != "window"})
    with pytest.raises(LoaderError, match="world_size"):
        check_compatible(make(), **ORDER, world_size=2)  # the layout is not compared: an elastic resume


def test_every_state_has_every_key_and_one_without_the_optional_ones_loads():
    """torch.distributed.checkpoint loads a checkpoint into the keys of the state a fresh loader
    gives: a key some states leave out (``even_batches`` at its default, ``remainder``) was
    missing on one side or dropped on the other."""
    default = make()
    assert default.to_dict()["even_batches"] is True and default.to_dict()["remainder"] is None
    assert set(default.to_dict()) == set(make(even_batches=False).to_dict())
    earlier = {k: v for k, v in default.to_dict().items() if k not in ("even_batches", "remainder", "mix")}
    assert LoaderState.from_dict(earlier) == default  # an earlier shardkit's state, without them
    uneven = make(even_batches=False)
    assert uneven.to_dict()["even_batches"] is False
    assert LoaderState.from_dict(json.loads(json.dumps(uneven.to_dict()))) == uneven
    with pytest.raises(LoaderError, match="even_batches"):
        make(even_batches="no")


def test_a_remainder_round_trips_and_bounds_the_steps():
    s = make(remainder=[[0, 10], [50, 60]], batches_consumed=1)  # 20 samples over 2 ranks of 8: 2 steps
    assert LoaderState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.layout_samples == 20 and s.resume_at(0) == (3, 1)
    assert make(remainder=[[0, 10], [50, 60]], batches_consumed=2).resume_at(1) == (4, 0)
    with pytest.raises(LoaderError, match="batches_consumed"):
        make(remainder=[[0, 10], [50, 60]], batches_consumed=3)


@pytest.mark.parametrize(
    "remainder",
    [[], [[0]], [[5, 5]], [[6, 9], [0, 3]], [[0, 101]], [[-1, 3]], [[0, 3.0]], [[0, True]], "0-3", [[3, 6], [5, 8]]],
)
def test_a_malformed_remainder_is_refused(remainder):
    with pytest.raises(LoaderError, match="remainder"):
        make(remainder=remainder, batches_consumed=0)


def test_uneven_resume_caps_each_rank_at_its_batch_count():
    # 100 samples in batches of 8: 13 batches (the last of 4) over 2 ranks: 6 on rank 0, 7 on rank 1
    base = dict(CONFIG, epoch=3, even_batches=False)
    assert [LoaderState(**base, batches_consumed=5).resume_at(r) for r in (0, 1)] == [(3, 5), (3, 5)]
    # rank 0 is done, rank 1 has its last batch to go: rank 0 waits out the step in epoch 3
    assert [LoaderState(**base, batches_consumed=6).resume_at(r) for r in (0, 1)] == [(3, 6), (3, 6)]
    assert [LoaderState(**base, batches_consumed=7).resume_at(r) for r in (0, 1)] == [(4, 0), (4, 0)]
    with pytest.raises(LoaderError, match="batches_consumed"):
        LoaderState(**base, batches_consumed=8)
