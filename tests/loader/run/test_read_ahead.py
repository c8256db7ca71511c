"""Read-ahead across epochs (``ShardLoader(read_ahead=True)``, the default): workers run on into
the next epoch, and the next iteration takes over what they prepared only when it asks for that
epoch from its start. Same batches as epochs run one at a time, whatever the loop does."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import ShardLoader, transforms
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.run.stream import BatchStream, raise_failures
from shardkit.loader.stats import StageStats

pytestmark = pytest.mark.timeout(240)


@dataclass
class _Asked:
    """A batch that is what its builder was asked to build."""

    triples: tuple[tuple[int, int, int], ...]
    keys: list[str] = field(default_factory=list)
    stats: StageStats = field(default_factory=StageStats)


class _Recorder:
    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> _Asked:
        return _Asked(tuple(zip(shards, indices, seeds, strict=True)))


def _stream(config: PlanConfig, control: torch.Tensor, worker: int, workers: int,
            read_ahead: bool) -> Iterator[Any]:
    """Worker ``worker`` of ``workers``' stream (as a feeder layout names it)."""
    return iter(BatchStream[_Asked](config, _Recorder(), control, layout=(worker, workers, workers),
                                    read_ahead=read_ahead))


def _merged(config: PlanConfig, workers: int, epoch: int, start: int, read_ahead: bool) -> list[Any]:
    """The streams of ``workers`` workers merged round-robin, as torch's DataLoader merges them."""
    control = torch.tensor([epoch, start])
    streams = [_stream(config, control, w, workers, read_ahead) for w in range(workers)]

    def robin() -> Iterator[Any]:
        for w in itertools.cycle(range(workers)):
            item = next(streams[w], None)
            if item is None:
                return
            yield item

    return list(raise_failures(robin()))


@pytest.mark.parametrize(("workers", "start", "drop_last"), [(1, 0, False), (3, 0, True), (4, 2, False),
                                                             (5, 7, True)])
def test_the_stream_runs_on_into_whole_epochs_that_start_at_worker_0(workers: int, start: int,
                                                                     drop_last: bool) -> None:
    config = PlanConfig(shard_sizes=[10, 7, 10, 3], seed=3, shuffle=True, window=2, rank=0, world_size=1,
                        batch_size=4, drop_last=drop_last)
    want = _merged(config, workers, 5, start, read_ahead=False)
    for epoch in (6, 7):
        want += _merged(config, workers, epoch, 0, read_ahead=False)
    control = torch.tensor([5, start])
    streams = [_stream(config, control, w, workers, True) for w in range(workers)]
    merged: Iterator[Any] = raise_failures(next(streams[w]) for w in itertools.cycle(range(workers)))
    assert list(itertools.islice(merged, len(want))) == want


def test_an_epoch_without_batches_ends_the_stream() -> None:
    config = PlanConfig(shard_sizes=[3], seed=0, shuffle=False, window=1, rank=0, world_size=1, batch_size=8,
                        drop_last=True)
    stream = BatchStream[_Asked](config, _Recorder(), torch.tensor([0, 0]), read_ahead=True)
    assert list(stream) == []


T = transforms.imagenet_train(32)


def _loader(ds: Path, **kw: Any) -> ShardLoader:
    args: dict[str, Any] = {"batch_size": 8, "transform": T, "keys": True, "seed": 5, "num_workers": 3} | kw
    return ShardLoader(str(ds), **args)


def _run(loader: ShardLoader) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """Whole epochs 0 and 1 (the second read ahead), a jump to epoch 5, an iteration left after 2
    batches, the next one (epoch 6 afresh), a mid-epoch state loaded back, then epoch 7."""
    out: list[Any] = []
    for epoch in (0, 1, 5):
        loader.set_epoch(epoch)
        out += list(loader)
    it = iter(loader)
    out += [next(it), next(it)]
    del it
    it = iter(loader)
    out += [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    loader.load_state_dict(state)
    out += list(loader)
    out += list(loader)
    return out


@pytest.mark.parametrize("feeders", [0, 2])
def test_read_ahead_gives_the_batches_of_epochs_run_one_at_a_time(packed: Path, feeders: int) -> None:
    with _loader(packed, feeders=feeders, read_ahead=False) as plain:
        want = _run(plain)
    with _loader(packed, feeders=feeders) as ahead:
        got = _run(ahead)
        if feeders == 0:
            assert ahead._supply.run is not None and ahead._supply.run._kept is not None  # the last epoch's, kept
    assert [k for _, _, k in got] == [k for _, _, k in want]
    for (x1, y1, _), (x2, y2, _) in zip(got, want, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_a_whole_epoch_keeps_its_delivery_and_close_stops_the_workers(packed: Path) -> None:
    others = set(multiprocessing.active_children())  # an earlier test's in this process are not this loader's
    loader = _loader(packed)
    assert loader._supply.run is not None
    list(loader)
    assert loader._supply.run._kept is not None and loader._supply.run._kept[0] == 1
    loader.set_epoch(3)
    it = iter(loader)
    next(it)  # another epoch: the kept delivery was dropped for a fresh one
    assert loader._supply.run._kept is None
    del it
    loader.close()
    assert set(multiprocessing.active_children()) - others == set()


@pytest.mark.parametrize(("feeders", "read_ahead"), [(0, False), (0, True), (2, False), (2, True)])
def test_an_epoch_run_again_after_an_elastic_resume_into_it_is_whole(packed: Path, feeders: int,
                                                                     read_ahead: bool) -> None:
    """An elastic resume into epoch 1 leaves the workers a remainder of it: going back to epoch 0
    and then on into epoch 1 must run epoch 1 whole (the workers restart; nothing read ahead on the
    remainder is taken over)."""
    with _loader(packed, feeders=0) as first:
        first.set_epoch(1)
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
        del it
    with _loader(packed, batch_size=5, feeders=feeders, read_ahead=read_ahead) as fresh:
        fresh.set_epoch(1)
        want = [k for _, _, k in fresh]
    with _loader(packed, batch_size=5, feeders=feeders, read_ahead=read_ahead) as loader:
        loader.load_state_dict(state)  # another batch size: an elastic resume into epoch 1
        rest = [k for _, _, k in loader]
        assert 0 < len(rest) < len(want)
        loader.set_epoch(0)
        list(loader)
        assert [k for _, _, k in loader] == want


@pytest.mark.parametrize("read_ahead", [False, True])
def test_an_older_iterator_that_finishes_late_keeps_nothing(packed: Path, read_ahead: bool) -> None:
    with _loader(packed, read_ahead=read_ahead) as reference:
        reference.set_epoch(1)
        want = [k for _, _, k in reference]
    with _loader(packed, read_ahead=read_ahead) as loader:
        old = iter(loader)
        for _ in range(len(loader)):
            next(old)  # all of epoch 0; `old` waits after its last batch
        newer = iter(loader)  # epoch 1 starts
        for _ in range(3):
            next(newer)
        assert list(old) == []  # the old iterator ends now, after the newer one took the workers
        del newer
        loader.set_epoch(1)
        assert [k for _, _, k in loader] == want


def test_a_loader_pickles_after_a_whole_epoch(packed: Path) -> None:
    import pickle

    with _loader(packed, num_workers=0) as loader:
        first = list(loader)
        copy = pickle.loads(pickle.dumps(loader))
        with copy:
            assert len(list(copy)) == len(first)


def test_the_time_between_epochs_is_not_the_loaders(packed: Path) -> None:
    """``stats.elapsed_s`` (time between deliveries) of an epoch taken over from read-ahead starts
    when the loop asks for it, not when the epoch before ended."""
    import time

    with _loader(packed) as loader:
        list(loader)
        time.sleep(0.5)  # the loop's own work between epochs (validation, a checkpoint)
        before = loader.stats.elapsed_s
        t0 = time.perf_counter()
        list(loader)
        wall = time.perf_counter() - t0
        assert loader.stats.elapsed_s - before <= wall


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_without_batches_then_a_pause_leaves_the_times_whole(packed: Path, num_workers: int) -> None:
    """An elastic resume that leaves fewer samples than a batch (drop_last) runs an epoch of no
    batches; the delivery it keeps never started, and the epoch after it still counts its time."""
    import time

    with _loader(packed, num_workers=num_workers) as first:
        it = iter(first)
        for _ in range(8):  # 64 of 69 samples
            next(it)
        state = first.state_dict()
        del it
    with _loader(packed, batch_size=10, drop_last=True, num_workers=num_workers) as loader:
        loader.load_state_dict(state)
        assert list(loader) == []
        time.sleep(0.3)
        t0 = time.perf_counter()
        assert len(list(loader)) == len(loader)
        assert 0 < loader.stats.elapsed_s <= time.perf_counter() - t0


def test_an_older_iterator_that_ends_late_does_not_move_the_loader_back(packed: Path) -> None:
    with _loader(packed) as reference:
        reference.set_epoch(2)
        want = [k for _, _, k in reference]
    with _loader(packed) as loader:
        old = iter(loader)
        for _ in range(len(loader)):
            next(old)  # all of epoch 0; `old` waits after its last batch
        list(loader)  # epoch 1, whole, by a newer iteration
        assert list(old) == [] and loader.epoch == 2
        assert [k for _, _, k in loader] == want


@pytest.mark.parametrize(("workers", "feeders", "epochs"), [(0, 0, 400), (2, 0, 400), (1, 1, 1100)])
def test_epoch_after_epoch_does_not_nest_deliveries(packed: Path, workers: int, feeders: int, epochs: int) -> None:
    """Each epoch taken over from read-ahead used to wrap the last one's delivery once more, so a
    long run (about 980 epochs, whatever the data's size) ended in a RecursionError. With a low
    recursion limit, a few hundred one-batch epochs show whether the nesting grows."""
    import inspect
    import sys

    with _loader(packed, num_workers=workers, feeders=feeders, batch_size=10_000, drop_last=False) as loader:
        assert len(loader) == 1
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(len(inspect.stack()) + 150)  # a feeder keeps the default limit: more epochs
        try:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                assert sum(1 for _ in loader) == 1
        finally:
            sys.setrecursionlimit(limit)
        if feeders == 0:
            assert loader._supply.run is not None and loader._supply.run._kept is not None  # read ahead throughout
        else:
            assert loader.feeders == 1


def _epochs_left_early(loader: Any) -> list[list[str]]:
    """Keys of epochs 0-3, epochs 0 and 2 left after 3 batches."""
    got = []
    for epoch in range(4):
        loader.set_epoch(epoch)
        for i, (_, _, keys) in enumerate(loader):
            got.append(list(keys))
            if epoch % 2 == 0 and i == 2:
                break
    return got


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copy_with_workers_gives_the_epochs_asked_for(packed: Path, how: str) -> None:
    """A copy of a loader (pickled, as a launcher that spawns its processes does, or deep-copied)
    gives the batches of the original, epochs left early included: its workers read where each
    epoch starts from memory they share with it. A copy once kept that in private memory, and an
    epoch opened while its workers ran gave the epoch they had started."""
    import copy
    import pickle

    with _loader(packed) as original:
        want = _epochs_left_early(original)
    fresh = _loader(packed)
    twin = pickle.loads(pickle.dumps(fresh)) if how == "pickle" else copy.deepcopy(fresh)
    fresh.close()
    with twin:
        assert _epochs_left_early(twin) == want
