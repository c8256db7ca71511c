"""Smoke test of benchmarks/bench_plan.py's measuring functions on a tiny manifest (no timing asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_plan import cell, measure, run_isolated, synthetic_sizes
from shardkit.loader.epochs.mix import Mix, MixedOrder
from shardkit.loader.epochs.plan import epoch_order, rank_batches


def test_synthetic_sizes_sum_exactly() -> None:
    sizes = synthetic_sizes(1000, 7)
    assert len(sizes) == 7 and sum(sizes) == 1000 and min(sizes) > 0
    assert synthetic_sizes(10, 3, jitter=0) == [4, 3, 3]
    with pytest.raises(ValueError):
        synthetic_sizes(3, 4)


def test_measure_gives_the_plans_first_batch() -> None:
    sizes = synthetic_sizes(5000, 20)
    first = measure("first", sizes, world_size=2, batch_size=16)
    order = epoch_order(sizes, seed=0, epoch=0, shuffle=True)
    rank0 = rank_batches(order, rank=0, world_size=2, batch_size=16, drop_last=False)
    assert first["ids"] == rank0[0].tolist() and first["batch"] == 0
    resumed = measure("resume", sizes, world_size=2, batch_size=16)
    at = resumed["state"]
    assert resumed["batch"] == at["batches_consumed"]
    order = epoch_order(sizes, seed=0, epoch=at["epoch"], shuffle=True)
    rank0 = rank_batches(order, rank=0, world_size=2, batch_size=16, drop_last=False)
    assert resumed["ids"] == rank0[at["batches_consumed"]].tolist()
    for m in (first, resumed):
        assert m["seconds"] >= 0 and m["peak_mib"] > 0


def test_measure_a_mix_gives_the_mixed_plans_first_batch() -> None:
    sizes = synthetic_sizes(5000, 20)
    first = measure("first", sizes, world_size=2, batch_size=16, mix=[0.7, 0.3], split=0.9)
    mix = Mix([sizes[:18], sizes[18:]], [0.7, 0.3])
    order = MixedOrder(mix, seed=0, epoch=0, shuffle=True)
    rank0 = rank_batches(order.ids(np.arange(5000)), rank=0, world_size=2, batch_size=16, drop_last=False)
    assert first["ids"] == rank0[0].tolist()


def test_isolated_run_and_cell() -> None:
    sizes = synthetic_sizes(3000, 10)
    r = run_isolated("first", sizes, cap_gib=1.0, world_size=1, batch_size=8)
    assert r["ids"] == measure("first", sizes, world_size=1, batch_size=8)["ids"]
    assert r["plan_mib"] >= 0 and r["base_mib"] > 0
    c = cell("resume", 3000, 10, 1, repeats=2, single_above=60.0, cap_gib=1.0, jitter=0.2)
    assert c["runs"] == 2 and len(c["seconds_all"]) == 2


def test_a_plan_over_the_cap_is_a_memory_error_not_a_crash() -> None:
    # 5e7 shards: each of the plan's arrays is 400 MB, far over a 16 MiB cap plus whatever the
    # parent left mapped for the child to reuse: MemoryError inside the child
    sizes = np.full(50_000_000, 2)
    r = run_isolated("first", sizes, cap_gib=1 / 64, world_size=1)
    assert r["error"] == "MemoryError"
