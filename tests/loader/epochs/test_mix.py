"""Property tests of dataset mixing: quotas, each epoch's composition, turns over epochs, slices,
and exact and elastic resume of a mix's plan."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import LoaderError
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.mix import Mix, MixedOrder, epoch_quotas
from shardkit.loader.epochs.plan import EpochOrder, shard_offsets
from shardkit.loader.epochs.remainder import Remainder
from shardkit.loader.epochs.state import LoaderState, check_compatible
from tests.loader.epochs.test_plan import shard_sizes

SEED = 5


@st.composite
def mixes(draw: st.DrawFn, max_n: int = 400) -> tuple[list[list[int]], list[int] | None]:
    """Two or three datasets (shard sizes, empty shards included) and integer weights (or None)."""
    count = draw(st.integers(2, 3))
    sizes = [draw(shard_sizes(max_n=max_n)) for _ in range(count)]
    weights = draw(st.none() | st.lists(st.integers(1, 20), min_size=count, max_size=count))
    return sizes, weights


def _mix(sizes: list[list[int]], weights: list[int] | None) -> Mix | None:
    """The mix, or None when some quota rounds to 0 (refused, tested on its own)."""
    try:
        return Mix(sizes, weights)
    except LoaderError as err:
        assert "gives it 0" in str(err)
        return None


def _dataset_of(mix: Mix, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dataset, sample id within it) of ids in the joined index."""
    starts = np.cumsum([0, *mix.dataset_samples])
    dataset = np.searchsorted(starts, ids, side="right") - 1
    return dataset, ids - starts[dataset]


def _epoch_ids(mix: Mix, epoch: int, shuffle: bool = True, window: int = 3) -> np.ndarray:
    order = MixedOrder(mix, seed=SEED, epoch=epoch, shuffle=shuffle, window=window)
    return order.ids(np.arange(order.num_samples))


@settings(max_examples=300, deadline=None)
@given(n=st.lists(st.integers(1, 10**9), min_size=1, max_size=5), data=st.data())
def test_quotas_sum_to_the_epoch_and_round_each_share_by_less_than_one(n, data):
    weights = data.draw(st.lists(st.floats(1e-3, 1e3), min_size=len(n), max_size=len(n)))
    try:
        quotas = epoch_quotas(n, weights)
    except LoaderError as err:
        assert "gives it 0" in str(err)
        return
    total, w = sum(n), [Fraction(x) for x in weights]
    assert sum(quotas) == total
    assert all(abs(q - total * x / sum(w)) < 1 for q, x in zip(quotas, w, strict=True))
    assert epoch_quotas(n) == n  # no weights: concatenation


def test_quotas_by_largest_remainder_ties_to_the_earlier_dataset():
    assert epoch_quotas([10, 10], [0.7, 0.3]) == [14, 6]
    assert epoch_quotas([1, 1, 1], [1, 1, 1]) == [1, 1, 1]
    assert epoch_quotas([2, 2, 1], [1, 1, 1]) == [2, 2, 1]  # 5/3 each: the first two take the spares
    assert epoch_quotas([5, 5], [2, 1]) == [7, 3]


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1.0], "1 entries for 2 datasets"),
        ([1.0, 0.0], "weight of dataset 1 must be a positive finite number"),
        ([1.0, -2], "weight of dataset 1"),
        ([float("nan"), 1.0], "weight of dataset 0"),
        ([float("inf"), 1.0], "weight of dataset 0"),
        ([True, 1.0], "weight of dataset 0"),
        (["0.5", 1.0], "weight of dataset 0"),
        ("ab", "sequence of numbers"),
        ([1e-9, 1.0], "dataset 0's weight 1e-09 gives it 0 of an epoch's 20 samples"),
        ([10**400, 1], "weight of dataset 0 must be below 2\\*\\*64, got a number of 1329 bits"),
        ([1, -(10**5000)], "weight of dataset 1 must be a positive finite number, got 'an integer of 16610 bits'"),
        ([1, 2**64], "weight of dataset 1 must be below 2\\*\\*64"),
    ],
)
def test_bad_weights_are_refused_naming_the_dataset(weights, match):
    with pytest.raises(LoaderError, match=match):
        epoch_quotas([10, 10], weights)


def test_a_mix_needs_two_datasets_with_samples():
    with pytest.raises(LoaderError, match="at least two"):
        Mix([[3, 4]])
    with pytest.raises(LoaderError, match="dataset b has no samples"):
        Mix([[3], [0, 0]], names=["a", "b"])


@settings(max_examples=200, deadline=None)
@given(mix=mixes(), epoch=st.integers(0, 50), shuffle=st.booleans())
def test_every_epoch_holds_each_datasets_quota(mix, epoch, shuffle):
    """Each dataset supplies exactly its quota; an under-weighted one (quota <= N) never twice,
    an over-weighted one each sample floor(q/N) or ceil(q/N) times."""
    m = _mix(*mix)
    if m is None:
        return
    dataset, local = _dataset_of(m, _epoch_ids(m, epoch, shuffle))
    for i, (n, quota) in enumerate(zip(m.dataset_samples, m.quotas, strict=True)):
        counts = Counter(local[dataset == i].tolist())
        assert sum(counts.values()) == quota
        assert set(counts.values()) <= {quota // n, -(-quota // n)}
        if quota >= n:
            assert len(counts) == n  # every sample at least once


@settings(max_examples=150, deadline=None)
@given(mix=mixes(max_n=200), round_=st.integers(0, 5), shuffle=st.booleans())
def test_an_under_weighted_dataset_shows_every_sample_in_each_round(mix, round_, shuffle):
    """Over each round of ceil(N / r) epochs (r = quota mod N), every sample of the dataset appears."""
    m = _mix(*mix)
    if m is None:
        return
    for i, (n, quota) in enumerate(zip(m.dataset_samples, m.quotas, strict=True)):
        turn = quota % n
        if turn == 0:
            continue
        per_round = math.ceil(n / turn)
        seen: set[int] = set()
        for epoch in range(round_ * per_round, (round_ + 1) * per_round):
            dataset, local = _dataset_of(m, _epoch_ids(m, epoch, shuffle))
            seen.update(local[dataset == i].tolist())
        assert seen == set(range(n))


def test_turns_move_on_and_rounds_reshuffle():
    m = Mix([[10] * 10, [10] * 10], weights=[0.3, 0.7])  # quotas 60 of 100 and 140 of 100
    assert m.quotas == [60, 140]
    epochs = [_dataset_of(m, _epoch_ids(m, e)) for e in range(4)]
    first = [set(local[dataset == 0].tolist()) for dataset, local in epochs]
    assert first[0] | first[1] == set(range(100))  # round 0: epochs 0 and 1
    assert len(first[0] & first[1]) == 20  # 2 * 60 - 100 shown twice in the round
    assert first[2] != first[0]  # round 1 orders the shards anew
    assert not np.array_equal(_epoch_ids(m, 0), _epoch_ids(m, 2))


@settings(max_examples=100, deadline=None)
@given(mix=mixes(), epoch=st.integers(0, 20))
def test_slices_lie_in_their_shards_and_stay_few(mix, epoch):
    m = _mix(*mix)
    if m is None:
        return
    shard, start, count = m.slices(seed=SEED, epoch=epoch, shuffle=True)
    assert count.sum() == m.num_samples
    assert (start >= 0).all() and (start + count <= m.shard_sizes[shard]).all()
    bound = sum((q // n + 1) * s.size + 2 for n, q, s in zip(m.dataset_samples, m.quotas, m.sizes, strict=True))
    assert shard.size <= bound


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(shard_sizes(max_n=300), min_size=2, max_size=3), epoch=st.integers(0, 9),
       shuffle=st.booleans())
def test_without_weights_a_mix_is_the_concatenation(sizes, epoch, shuffle):
    """Quotas equal to the sizes: the slices are the shards, so the order is exactly that of one
    dataset holding every shard."""
    m = Mix(sizes)
    joined = [s for part in sizes for s in part]
    plain = EpochOrder(joined, seed=SEED, epoch=epoch, shuffle=shuffle, window=3)
    positions = np.arange(m.num_samples)
    assert np.array_equal(_epoch_ids(m, epoch, shuffle), plain.ids(positions))


def test_the_plan_is_a_function_of_seed_and_epoch():
    m = Mix([[7, 0, 9, 4], [5, 5]], weights=[2, 1])
    assert np.array_equal(_epoch_ids(m, 3), _epoch_ids(Mix([[7, 0, 9, 4], [5, 5]], weights=[4, 2]), 3))
    other = MixedOrder(m, seed=SEED + 1, epoch=3, shuffle=True, window=3)
    assert not np.array_equal(_epoch_ids(m, 3), other.ids(np.arange(m.num_samples)))


def test_without_shuffle_turns_walk_the_dataset_in_order():
    m = Mix([[4, 4], [2]], weights=[1, 1])  # quotas 5 of 8 and 5 of 2
    assert m.quotas == [5, 5]
    ids = [_epoch_ids(m, e, shuffle=False).tolist() for e in range(2)]
    assert ids[0] == [0, 1, 2, 3, 4, 8, 9, 8, 9, 8]  # dataset 1: two passes and a turn of one
    assert ids[1] == [5, 6, 7, 0, 1, 8, 9, 8, 9, 9]  # dataset 0's round ends and wraps to its start


def _configs(m: Mix, world: int, batch: int, drop_last: bool, even: bool) -> list[PlanConfig]:
    return [PlanConfig(shard_sizes=m.shard_sizes, seed=SEED, shuffle=True, window=3, rank=r, world_size=world,
                       batch_size=batch, drop_last=drop_last, even_batches=even, mix=m) for r in range(world)]


def _run(configs: list[PlanConfig], epoch: int, start: int, stop: int | None,
         rest: Remainder | None) -> list[tuple[int, int]]:
    """(epoch position, joined id) each rank delivers in steps [start, stop), ranks in lock step."""
    order = configs[0].order(epoch)
    offsets = shard_offsets(configs[0].shard_sizes)
    out: list[tuple[int, int]] = []
    counts = [c.epoch_batches(rest) for c in configs]
    for step in range(start, max(counts) if stop is None else stop):
        for cfg, count in zip(configs, counts, strict=True):
            if step < count:
                shards, indices, positions = cfg.batch(order, step, rest)
                out += zip(positions.tolist(), (offsets[shards] + indices).tolist(), strict=True)
    return out


layouts = st.tuples(st.integers(1, 4), st.integers(1, 9), st.booleans())  # world, batch, even_batches


@settings(max_examples=150, deadline=None)
@given(mix=mixes(max_n=300), drop_last=st.booleans(), epoch=st.integers(0, 6),
       layout=st.lists(layouts, min_size=1, max_size=3), data=st.data())
def test_a_mix_resumes_exactly_and_elastically(mix, drop_last, epoch, layout, data):
    """Stop and resume an epoch of a mix on the same layout (the very same batches follow) and on
    others (the rest is what was not delivered: with drop_last none twice, each at least once
    without); a state from one mix is refused by another."""
    m = _mix(*mix)
    if m is None:
        return
    layout = [layout[0], *layout]  # the first resume keeps the layout: an exact resume
    world0, batch0, even0 = layout[0]
    whole = _run(_configs(m, world0, batch0, drop_last, even0), epoch, 0, None, None)
    delivered: list[tuple[int, int]] = []
    state = None
    for i, (world, batch, even) in enumerate(layout):
        configs = _configs(m, world, batch, drop_last, even)
        rest, start = None, 0
        if state is not None:
            resumed_epoch, start, rest = configs[0].resume(state)
            if resumed_epoch != epoch:
                break
        steps = max(c.epoch_batches(rest) for c in configs)
        last = i == len(layout) - 1
        k = steps if last else data.draw(st.integers(start, steps))
        delivered += _run(configs, epoch, start, k, rest)
        if i == 0:
            tail = _run(configs, epoch, k, None, None)
            assert delivered + tail == whole  # the uninterrupted run
        if last or k == steps:
            break
        state = configs[0].state(epoch, k, rest).to_dict()
        if i == 0:  # exact: a fresh config on the same layout continues with the very batches
            assert _run(configs, epoch, *configs[0].resume(state)[1:2], None, None) == tail
    positions = Counter(p for p, _ in delivered)
    if drop_last:
        assert max(positions.values(), default=1) == 1
    else:
        assert set(positions) >= set(range(m.num_samples))
    other = _mix(mix[0], [7, *[1] * (len(mix[0]) - 1)])
    if state is not None and other is not None and other.quotas != m.quotas:
        with pytest.raises(LoaderError, match="mix: the weights differ: dataset"):
            _configs(other, 1, 1, drop_last, True)[0].resume(state)


def test_a_single_dataset_state_is_refused_by_a_mix_and_the_reverse():
    m = Mix([[5, 5], [10]], weights=[1, 3])
    mixed = _configs(m, 1, 2, False, True)[0]
    single = PlanConfig(shard_sizes=m.shard_sizes, seed=SEED, shuffle=True, window=3, rank=0, world_size=1,
                        batch_size=2, drop_last=False)
    with pytest.raises(LoaderError, match="mix: state has one dataset, loader has a mix of 2 datasets"):
        mixed.resume(single.state(0, 1).to_dict())
    with pytest.raises(LoaderError, match="mix: state has a mix of 2 datasets, loader has one dataset"):
        single.resume(mixed.state(0, 1).to_dict())
    assert single.state(0, 1).to_dict()["mix"] is None


def test_the_state_records_the_mix_and_validates_it():
    m = Mix([[5, 5], [10]], weights=[1, 3])
    state = _configs(m, 1, 2, False, True)[0].state(1, 3).to_dict()
    assert [r["quota"] for r in state["mix"]] == [5, 15]
    assert LoaderState.from_dict(state).mix == state["mix"]
    for bad, match in [
        ([state["mix"][0]], "two or more"),
        ([state["mix"][0], {**state["mix"][1], "quota": 14}], "quota sum to 19"),
        ([state["mix"][0], {**state["mix"][1], "extra": 1}], "must be a dict with keys"),
        ([state["mix"][0], {**state["mix"][1], "quota": "15"}], "must be an int"),
        ([state["mix"][0], {**state["mix"][1], "shards_digest": 3}], "shards_digest must be a str"),
    ]:
        with pytest.raises(LoaderError, match=match):
            LoaderState.from_dict({**state, "mix": bad})
    check_compatible(LoaderState.from_dict(state), seed=SEED, num_samples=20, shards_digest=state["shards_digest"],
                     shuffle=True, window=3, mix=m.record())


def test_weights_given_as_a_tensor_or_an_array_are_their_numbers():
    """``weights=torch.tensor([0.7, 0.3])`` was refused as "must be a positive finite number, got
    tensor(0.7000)", a positive finite number."""
    import numpy as np
    import torch

    want = epoch_quotas([10, 10], [3, 1])
    assert epoch_quotas([10, 10], torch.tensor([3.0, 1.0])) == epoch_quotas([10, 10], np.array([3, 1])) == want
    with pytest.raises(LoaderError, match=r"weight of dataset 1 must be a positive finite number, got -1.0"):
        epoch_quotas([10, 10], torch.tensor([1.0, -1.0]))
