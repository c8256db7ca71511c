"""Property tests of the epoch plan: permutation, window bound, partition, workers, resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardkit.errors import LoaderError
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.plan import (
    EpochOrder,
    epoch_order,
    locate,
    num_batches,
    rank_batches,
    shard_offsets,
    stream_positions,
    worker_batch_indices,
)
from shardkit.loader.epochs.seeds import sample_seed, sample_seeds


@st.composite
def shard_sizes(draw: st.DrawFn, max_n: int = 5000) -> list[int]:
    """Random shard sizes (empty shards included) totalling 1..max_n samples."""
    n = draw(st.integers(1, max_n))
    num_shards = draw(st.integers(1, min(n, 60)))
    cuts = draw(st.lists(st.integers(0, n), min_size=num_shards - 1, max_size=num_shards - 1))
    return np.diff([0, *sorted(cuts), n]).tolist()


def merge_round_robin(streams: list[range]) -> list[int]:
    """What torch's DataLoader does with iterable workers: take one from each in turn."""
    out, its = [], [iter(s) for s in streams]
    while its:
        for it in list(its):
            if (x := next(it, None)) is None:
                its.remove(it)
            else:
                out.append(x)
    return out


def open_shards(order: np.ndarray, offsets: np.ndarray) -> int:
    """Most shards a sequential reader of ``order`` has started but not finished at once."""
    shard, _ = locate(order, offsets)
    pos = np.arange(order.size)
    first = np.full(offsets.size - 1, order.size)
    last = np.full(offsets.size - 1, -1)
    np.minimum.at(first, shard, pos)
    np.maximum.at(last, shard, pos)
    used = last >= 0
    delta = np.zeros(order.size + 1, dtype=np.int64)
    np.add.at(delta, first[used], 1)
    np.add.at(delta, last[used] + 1, -1)
    return int(np.cumsum(delta).max())


@settings(max_examples=150, deadline=None)
@given(
    sizes=shard_sizes(),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 1000),
    window=st.integers(1, 10),
)
def test_epoch_order_is_a_deterministic_windowed_permutation(sizes, seed, epoch, window):
    order = epoch_order(sizes, seed=seed, epoch=epoch, shuffle=True, window=window)
    n = sum(sizes)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))
    again = epoch_order(sizes, seed=seed, epoch=epoch, shuffle=True, window=window)
    assert np.array_equal(order, again)
    assert open_shards(order, shard_offsets(sizes)) <= window
    assert np.array_equal(epoch_order(sizes, seed=seed, epoch=epoch, shuffle=False), np.arange(n))
    if n >= 20:  # two epochs coincide with probability < 1/20!
        other = epoch_order(sizes, seed=seed, epoch=epoch + 1, shuffle=True, window=window)
        assert not np.array_equal(order, other)


def test_window_groups_are_whole_shards():
    sizes = [5] * 12
    order = epoch_order(sizes, seed=3, epoch=0, shuffle=True, window=4)
    shard, _ = locate(order, shard_offsets(sizes))
    groups = [set(shard[i : i + 20].tolist()) for i in range(0, 60, 20)]
    assert all(len(g) == 4 for g in groups) and set.union(*groups) == set(range(12))
    assert open_shards(order, shard_offsets(sizes)) > 1  # samples really do mix across shards


@settings(max_examples=200, deadline=None)
@given(
    sizes=shard_sizes(),
    world_size=st.integers(1, 8),
    batch_size=st.integers(1, 64),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_ranks_partition_the_epoch(sizes, world_size, batch_size, drop_last, shuffle):
    n = sum(sizes)
    order = epoch_order(sizes, seed=7, epoch=1, shuffle=shuffle)
    if drop_last:
        assume(n >= world_size * batch_size)
    nb = num_batches(n, world_size=world_size, batch_size=batch_size, drop_last=drop_last)
    per_rank = [
        rank_batches(
            order, rank=r, world_size=world_size, batch_size=batch_size, drop_last=drop_last
        )
        for r in range(world_size)
    ]
    assert all(b.shape == (nb, batch_size) and b.dtype == np.int64 for b in per_rank)
    stream = np.concatenate([b.reshape(-1) for b in per_rank])
    counts = np.bincount(stream, minlength=n)
    if drop_last:
        assert counts.max() == 1 and n - stream.size < world_size * batch_size
        assert np.array_equal(stream, order[: stream.size])
    else:
        assert counts.min() >= 1 and stream.size - n < world_size * batch_size
        assert np.array_equal(stream, np.resize(order, stream.size))  # cyclic padding
        assert counts.max() - counts.min() <= 1  # repeats spread as evenly as possible


def test_drop_last_with_too_few_samples_gives_no_batches():
    batches = rank_batches(np.arange(5), rank=1, world_size=2, batch_size=4, drop_last=True)
    assert batches.shape == (0, 4)


def test_padding_wraps_when_pad_exceeds_dataset():
    batches = rank_batches(np.arange(3), rank=0, world_size=2, batch_size=5, drop_last=False)
    assert batches.tolist() == [[0, 1, 2, 0, 1]]


@settings(max_examples=200, deadline=None)
@given(
    nb=st.integers(0, 40),
    num_workers=st.integers(0, 4),
    start=st.integers(0, 40),
)
def test_workers_cover_all_batches_in_order_from_any_resume_point(nb, num_workers, start):
    start = min(start, nb)
    streams = [
        worker_batch_indices(nb, num_workers=num_workers, worker_id=w, start_batch=start)
        for w in range(max(num_workers, 1))
    ]
    assert merge_round_robin(streams) == list(range(start, nb))


@settings(max_examples=100, deadline=None)
@given(
    sizes=shard_sizes(max_n=2000),
    world_size=st.integers(1, 8),
    batch_size=st.integers(1, 64),
    workers=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    data=st.data(),
)
def test_resume_continues_the_uninterrupted_run(sizes, world_size, batch_size, workers, data):
    order = epoch_order(sizes, seed=11, epoch=3, shuffle=True)
    rank = data.draw(st.integers(0, world_size - 1))
    batches = rank_batches(
        order, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=False
    )
    nb = len(batches)
    k = data.draw(st.integers(0, nb))

    def run(num_workers: int, start: int) -> list[list[int]]:
        streams = [
            worker_batch_indices(nb, num_workers=num_workers, worker_id=w, start_batch=start)
            for w in range(max(num_workers, 1))
        ]
        return [batches[j].tolist() for j in merge_round_robin(streams)]

    full = run(workers[0], 0)
    assert full == batches.tolist()  # independent of the number of workers
    assert run(workers[1], k) == full[k:]


def test_locate_inverts_offsets():
    offsets = shard_offsets([3, 0, 2, 4])
    shard, index = locate(np.arange(9), offsets)
    assert shard.tolist() == [0, 0, 0, 2, 2, 3, 3, 3, 3]
    assert index.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    with pytest.raises(LoaderError):
        locate([9], offsets)


def test_sample_seeds_match_scalar_and_differ():
    positions = np.arange(10_000)
    seeds = sample_seeds(5, 2, positions)
    assert seeds.dtype == np.uint64
    assert [int(s) for s in seeds[:100]] == [sample_seed(5, 2, p) for p in range(100)]
    assert len(set(seeds.tolist())) == seeds.size
    assert sample_seed(5, 2, 0) != sample_seed(5, 3, 0) != sample_seed(6, 2, 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: shard_offsets([1, -1]),
        lambda: shard_offsets([1.5]),
        lambda: epoch_order([4], seed=-1, epoch=0, shuffle=True),
        lambda: epoch_order([4], seed=0, epoch=0, shuffle=True, window=0),
        lambda: rank_batches(np.arange(0), rank=0, world_size=1, batch_size=1, drop_last=False),
        lambda: rank_batches(np.arange(4), rank=2, world_size=2, batch_size=1, drop_last=False),
        lambda: rank_batches(np.arange(4), rank=0, world_size=1, batch_size=0, drop_last=False),
        lambda: num_batches(4, world_size=0, batch_size=1, drop_last=True),
        lambda: worker_batch_indices(4, num_workers=2, worker_id=2),
        lambda: worker_batch_indices(4, num_workers=0, worker_id=1),
        lambda: worker_batch_indices(4, num_workers=1, worker_id=0, start_batch=5),
        lambda: sample_seed(0, 0, -1),
    ],
)
def test_bad_arguments_raise_loader_error(call):
    with pytest.raises(LoaderError):
        call()


def test_imagenet_sized_order_is_a_permutation():
    # Speed of this case is measured in benchmarks, not asserted here (shared, noisy machines).
    sizes = [1000] * 1300
    order = epoch_order(sizes, seed=0, epoch=1, shuffle=True)
    assert order.size == 1_300_000
    assert np.array_equal(np.sort(order), np.arange(1_300_000))


@settings(max_examples=300, deadline=None)
@given(
    sizes=shard_sizes(),
    world_size=st.integers(1, 9),
    batch_size=st.integers(1, 64),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_uneven_batches_deliver_each_sample_once(sizes, world_size, batch_size, drop_last, shuffle):
    n = sum(sizes)
    order = epoch_order(sizes, seed=7, epoch=2, shuffle=shuffle)
    common = dict(world_size=world_size, batch_size=batch_size, drop_last=drop_last, even_batches=False)
    per_rank = [rank_batches(order, rank=r, **common) for r in range(world_size)]
    counts = [len(b) for b in per_rank]
    assert counts == [num_batches(n, rank=r, **common) for r in range(world_size)]
    assert max(counts) - min(counts) <= 1 and max(counts) == num_batches(n, **common)
    flat = [row for b in per_rank for row in b]
    assert all(row.dtype == np.int64 for row in flat)
    assert all(len(row) == batch_size for row in flat[:-1])  # only the epoch's last batch is short
    stream = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    if drop_last:
        assert stream.size == n - n % batch_size and (not flat or len(flat[-1]) == batch_size)
    else:
        assert stream.size == n  # every sample exactly once, no padding
    assert np.array_equal(stream, order[: stream.size])  # ranks take contiguous runs, in order
    # the stream positions (what seeds augmentation) are where each row sits in the order
    for r, b in enumerate(per_rank):
        for j, row in enumerate(b):
            assert np.array_equal(order[stream_positions(n, rank=r, batch_index=j, **common)], row)


def test_uneven_batches_when_there_are_fewer_batches_than_ranks():
    per_rank = [
        rank_batches(np.arange(5), rank=r, world_size=4, batch_size=2, drop_last=False, even_batches=False)
        for r in range(4)
    ]
    assert [[row.tolist() for row in b] for b in per_rank] == [[], [[0, 1]], [[2, 3]], [[4]]]
    shards, indices = locate(per_rank[3], shard_offsets([3, 2]))
    assert [s.tolist() for s in shards] == [[1]] and [i.tolist() for i in indices] == [[1]]
    assert [len(x) for x in locate(per_rank[0], shard_offsets([5]))] == [0, 0]


def test_uneven_default_is_unchanged():
    even = rank_batches(np.arange(5), rank=1, world_size=2, batch_size=2, drop_last=False)
    same = rank_batches(np.arange(5), rank=1, world_size=2, batch_size=2, drop_last=False, even_batches=True)
    assert even.tolist() == same.tolist() == [[4, 0], [1, 2]]
    with pytest.raises(LoaderError, match="rank"):
        num_batches(5, world_size=2, batch_size=2, drop_last=False, even_batches=False, rank=2)


@settings(max_examples=200, deadline=None)
@given(
    sizes=shard_sizes(max_n=3000),
    world_size=st.integers(1, 8),
    batch_size=st.integers(1, 64),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    even_batches=st.booleans(),
    window=st.integers(1, 10),
    data=st.data(),
)
def test_the_lazy_plan_delivers_the_materialised_plans_batches(
    sizes, world_size, batch_size, drop_last, shuffle, even_batches, window, data
):
    """What the loader runs (PlanConfig.batch over an EpochOrder, positions looked up one batch at a
    time, in any order) is row for row what rank_batches cuts from the whole epoch_order."""
    rank = data.draw(st.integers(0, world_size - 1))
    cfg = PlanConfig(shard_sizes=sizes, seed=5, shuffle=shuffle, window=window, rank=rank, world_size=world_size,
                     batch_size=batch_size, drop_last=drop_last, even_batches=even_batches)
    expected = rank_batches(epoch_order(sizes, seed=5, epoch=4, shuffle=shuffle, window=window), rank=rank,
                            world_size=world_size, batch_size=batch_size, drop_last=drop_last,
                            even_batches=even_batches)
    assert cfg.num_batches == len(expected)
    order = cfg.order(4)
    offsets = shard_offsets(sizes)
    for j in data.draw(st.permutations(range(cfg.num_batches))):
        shards, indices, positions = cfg.batch(order, j)
        assert (offsets[shards] + indices).tolist() == list(expected[j])
        n = sum(sizes)
        stream = stream_positions(n, rank=rank, batch_index=j, world_size=world_size, batch_size=batch_size,
                                  drop_last=drop_last, even_batches=even_batches)
        assert positions.tolist() == stream.tolist()  # seed positions: places in the padded stream


def test_stream_positions_refuse_a_batch_the_rank_does_not_have():
    with pytest.raises(LoaderError, match="batch index"):
        stream_positions(10, rank=0, batch_index=5, world_size=1, batch_size=2, drop_last=False)


def test_each_window_is_shuffled_from_its_own_seed():
    """Plan version 2: a window's order does not depend on the windows before it, so a rank can
    start at any window without drawing the others."""
    sizes = [7] * 40
    full = EpochOrder(sizes, seed=9, epoch=3, shuffle=True, window=4)
    late = np.arange(200, 280)
    alone = EpochOrder(sizes, seed=9, epoch=3, shuffle=True, window=4)
    assert np.array_equal(alone.ids(late), full.ids(np.arange(280))[200:])
    with pytest.raises(LoaderError, match="positions"):
        full.locate(np.array([280]))


def test_a_billion_samples_plan_in_memory_of_the_shards():
    """5e9 samples in 5e5 shards: the order is built and a late position found without any array
    of the number of samples (a per-sample array would need 40 GB)."""
    sizes = np.full(500_000, 10_000, dtype=np.int64)
    order = EpochOrder(sizes, seed=1, epoch=0, shuffle=True)
    shard, index = order.locate(np.array([4_999_999_999, 123_456_789]))
    assert shard.min() >= 0 and shard.max() < 500_000 and index.min() >= 0 and index.max() < 10_000
