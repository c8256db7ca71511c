"""Elastic resume: a state from W ranks with batch size B resumes on W' ranks with B' (any worker
count), and the rest of the epoch is exactly the samples not yet delivered."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.plan import num_batches, shard_offsets
from shardkit.loader.epochs.remainder import Remainder
from tests.loader.epochs.test_plan import shard_sizes

SEED, EPOCH = 13, 2


def _configs(sizes: list[int], world: int, batch: int, drop_last: bool, even: bool) -> list[PlanConfig]:
    return [PlanConfig(shard_sizes=sizes, seed=SEED, shuffle=True, window=3, rank=r, world_size=world,
                       batch_size=batch, drop_last=drop_last, even_batches=even) for r in range(world)]


def _run(configs: list[PlanConfig], start: int, stop: int | None, rest: Remainder | None) -> list[int]:
    """Sample ids every rank delivers in steps [start, stop) (ranks in lock step)."""
    order = configs[0].order(EPOCH)
    offsets = shard_offsets(configs[0].shard_sizes)
    ids: list[int] = []
    counts = [c.epoch_batches(rest) for c in configs]
    for step in range(start, max(counts) if stop is None else stop):
        for cfg, count in zip(configs, counts, strict=True):
            if step < count:
                shards, indices, _ = cfg.batch(order, step, rest)
                ids += (offsets[shards] + indices).tolist()
    return ids


layouts = st.tuples(st.integers(1, 6), st.integers(1, 16), st.booleans())  # world, batch, even_batches


@settings(max_examples=300, deadline=None)
@given(sizes=shard_sizes(max_n=1500), drop_last=st.booleans(), layout=st.lists(layouts, min_size=2, max_size=4),
       data=st.data())
def test_the_rest_of_the_epoch_is_what_was_not_delivered(sizes, drop_last, layout, data):
    """Resume any number of times within an epoch, on new layouts each time: with drop_last=True
    no sample twice and none lost but each layout's documented tail; with drop_last=False each
    sample at least once."""
    n = sum(sizes)
    delivered: list[int] = []
    state = None
    dropped_at_most = 0
    for i, (world, batch, even) in enumerate(layout):
        configs = _configs(sizes, world, batch, drop_last, even)
        rest, start = None, 0
        if state is not None:
            epoch, start, rest = configs[0].resume(state)
            # every rank agrees; on a rank with fewer batches (even_batches=False) the step is capped
            assert all(c.resume(state)[::2] == (epoch, rest) for c in configs[1:])
            if epoch != EPOCH:  # nothing was left of the epoch
                break
        steps = max(c.epoch_batches(rest) for c in configs)
        last = i == len(layout) - 1
        k = steps if last else data.draw(st.integers(start, steps))
        delivered += _run(configs, start, k, rest)
        if drop_last and start == 0:  # a new layout never hands out fewer than W*B (even) or B (uneven)
            dropped_at_most += (world * batch if even else batch) - 1
        if last or k == steps:
            break
        state = configs[0].state(EPOCH, k, rest).to_dict()
    counts = Counter(delivered)
    if drop_last:
        assert max(counts.values(), default=1) == 1  # none twice
        assert n - len(counts) <= dropped_at_most
    else:
        assert set(counts) == set(range(n))  # each at least once


@settings(max_examples=100, deadline=None)
@given(sizes=shard_sizes(max_n=800), world=st.integers(1, 5), batch=st.integers(1, 12), drop_last=st.booleans(),
       even=st.booleans(), data=st.data())
def test_the_same_layout_resumes_exactly(sizes, world, batch, drop_last, even, data):
    """W -> W with the same batch size is the exact resume: the remaining steps are the very batches."""
    configs = _configs(sizes, world, batch, drop_last, even)
    steps = max(c.num_batches for c in configs)
    k = data.draw(st.integers(0, steps))
    state = configs[0].state(EPOCH, k).to_dict()
    if k == steps:
        assert configs[0].resume(state) == (EPOCH + 1, 0, None)
        return
    assert [c.resume(state)[:2] for c in configs] == [(EPOCH, min(k, c.num_batches)) for c in configs]
    assert all(c.resume(state)[2] is None for c in configs)


def test_remainder_after_two_steps_of_two_ranks():
    # 20 samples, 2 ranks x 3: rank 0 has [0, 9), rank 1 [9, 18); after 2 steps each took 6
    rest = Remainder.whole(20).after(2, world_size=2, batch_size=3, drop_last=True, even_batches=True)
    assert rest.to_list() == [[6, 9], [15, 18]]
    assert rest.positions(np.arange(6)).tolist() == [6, 7, 8, 15, 16, 17]
    # on 3 ranks of 2, those 6 are one step
    again = rest.after(1, world_size=3, batch_size=2, drop_last=True, even_batches=True)
    assert len(again) == 0


def _loader(dataset: Path, **kw: object) -> ShardLoader:
    args: dict[str, object] = {"batch_size": 4, "transform": transforms.imagenet_val(32), "keys": True,
                               "seed": 5, "drop_last": True, "num_workers": 0}
    args.update(kw)
    return ShardLoader(str(dataset), **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [(0, 2), (1, 0)])
def test_a_loader_resumes_on_another_world_size_and_batch_size(packed: Path, workers: tuple[int, int]) -> None:
    """2 ranks x 4 stop after 2 steps; 3 ranks x 3 (other worker counts) deliver the rest of the epoch:
    nothing twice, nothing lost but the two layouts' tails; the next epoch is whole on 3 ranks."""
    first = [_loader(packed, rank=r, world_size=2, num_workers=workers[0]) for r in range(2)]
    seen: list[str] = []
    for loader in first:
        it = iter(loader)
        for _ in range(2):
            seen += next(it)[2]
    state = first[0].state_dict()
    assert state == first[1].state_dict()
    for loader in first:
        loader.close()
    n = first[0].manifest.num_samples
    second = [_loader(packed, rank=r, world_size=3, batch_size=3, num_workers=workers[1]) for r in range(3)]
    rest_counts = set()
    for loader in second:
        loader.load_state_dict(state)
        assert loader.epoch == 0
        batches = [keys for *_, keys in loader]
        rest_counts.add(len(batches))
        seen += [k for keys in batches for k in keys]
    assert len(rest_counts) == 1  # every new rank the same number of steps
    assert len(seen) == len(set(seen))
    assert n - len(seen) < 2 * 4 + 3 * 3
    resumed_state = second[0].state_dict()
    assert resumed_state["epoch"] == 1 and resumed_state["remainder"] is None
    nxt = [k for loader in second for *_, keys in loader for k in keys]  # epoch 1: whole, on 3 ranks
    assert len(nxt) == len(set(nxt)) == num_batches(n, world_size=3, batch_size=3, drop_last=True) * 9
    for loader in second:
        loader.close()


def test_a_mid_remainder_state_resumes_exactly(packed: Path) -> None:
    """A state taken inside an elastic remainder carries it: the same layout continues exactly."""
    state = _loader(packed, rank=0, world_size=2).state_dict() | {"batches_consumed": 1}
    one = _loader(packed, batch_size=5)
    one.load_state_dict(state)
    it = iter(one)
    next(it)
    mid = one.state_dict()
    assert mid["remainder"] is not None and mid["batches_consumed"] == 1
    expected = [keys for *_, keys in it]
    again = _loader(packed, batch_size=5, num_workers=1)
    again.load_state_dict(mid)
    assert [keys for *_, keys in again] == expected
    again.close()


def test_another_seed_or_dataset_is_refused_naming_the_field(packed: Path) -> None:
    state = _loader(packed).state_dict()
    with pytest.raises(LoaderError, match="seed"):
        _loader(packed, seed=6).load_state_dict(state)
    with pytest.raises(LoaderError, match="shuffle"):
        _loader(packed, shuffle=False).load_state_dict(state)
    with pytest.raises(LoaderError, match="num_samples"):
        _loader(packed).load_state_dict(state | {"num_samples": state["num_samples"] + 1})
