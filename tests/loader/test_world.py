"""The rank and world a loader reads for, and its batches at one rank, as DataLoader users expect.

- at one rank, ``drop_last=False`` gives a short last batch (no padding: that exists only to give
  several ranks equal batches);
- a loader built before the process group (Lightning's ``trainer.fit`` pattern: rank 1 sees
  ``WORLD_SIZE=2, LOCAL_RANK=1`` and no ``RANK``) reads its rank's share from its first iteration;
- a loader that iterated alone before the group (a look at a batch) is laid out anew at its next
  iteration; a world that changes during an iteration, or after one as a rank of several, is an
  error naming both, never duplication.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit import LoaderError, ShardLoader

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)


def _keys(loader: ShardLoader) -> list[list[str]]:
    return [list(keys) for _x, _y, keys in loader]


def test_one_rank_gives_a_short_last_batch_like_a_dataloader(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=32, keys=True)  # 69 samples
    batches = _keys(loader)
    assert [len(b) for b in batches] == [32, 32, 5] and len(loader) == 3
    assert sorted(k for b in batches for k in b) == sorted(set(k for b in batches for k in b))  # no repeats
    assert [len(b) for b in _keys(ShardLoader(str(packed), batch_size=32, keys=True, drop_last=True))] == [32, 32]


def test_two_ranks_still_get_equal_full_batches(packed: Path) -> None:
    sizes = [[len(b) for b in _keys(ShardLoader(str(packed), batch_size=32, keys=True, rank=r, world_size=2))]
             for r in range(2)]
    assert sizes == [[32, 32], [32, 32]]  # 128 >= 69: padded with repeats, as before


def test_a_one_rank_state_resumes_exactly(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=32, keys=True, seed=3)
    it = iter(loader)
    first = next(it)[2]
    state = loader.state_dict()
    resumed = ShardLoader(str(packed), batch_size=32, keys=True, seed=3)
    resumed.load_state_dict(state)
    whole = _keys(ShardLoader(str(packed), batch_size=32, keys=True, seed=3))
    assert [list(first), *_keys(resumed)] == whole


def test_a_loader_built_before_the_launcher_world_reads_its_ranks_share(packed: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    early = ShardLoader(str(packed), batch_size=8, keys=True, seed=5)  # no launcher variables yet: 0 of 1
    assert (early.config.rank, early.config.world_size) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's rank 1: no RANK
    assert len(early) == 5
    want = _keys(ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=1, world_size=2))
    assert _keys(early) == want and (early.config.rank, early.config.world_size) == (1, 2)


def test_a_state_loaded_before_the_world_is_known_resumes_for_the_live_rank(packed: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = [ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=r, world_size=2) for r in range(2)]
    for loader in ranks:
        it = iter(loader)
        next(it), next(it)
    state = ranks[1].state_dict()
    early = ShardLoader(str(packed), batch_size=8, keys=True, seed=5)
    early.load_state_dict(state)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    rest = _keys(early)
    whole = _keys(ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=1, world_size=2))
    assert rest == whole[2:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_look_at_a_batch_before_the_process_group_then_reads_the_ranks_share(
        packed: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """``next(iter(loader))`` before Lightning's ``trainer.fit`` (a look at the shapes) iterated as
    rank 0 of 1, and fit then failed on every rank ("iterated as rank 0 of 1, but this process is
    now rank 0 of 2"). The next iteration is laid out for the live world, as a first one is: the
    next epoch, this rank's share, its workers started anew."""
    loader = ShardLoader(str(packed), batch_size=8, keys=True, seed=5, num_workers=workers)
    peek = next(iter(loader))[2]  # the iterator dropped: ended, left mid-epoch
    assert len(peek) == 8
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert len(loader) == 5 and loader.epoch == 1
    want = ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=1, world_size=2)
    want.set_epoch(1)
    assert _keys(loader) == _keys(want) and (loader.config.rank, loader.config.world_size) == (1, 2)


def test_a_state_taken_after_the_look_resumes_the_rest_of_its_epoch_over_the_ranks(
        packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = ShardLoader(str(packed), batch_size=8, keys=True, seed=5)
    peek = list(next(iter(loader))[2])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert len(loader) == 5  # laid out anew (as by Lightning's len() before its loop)
    state = loader.state_dict()  # what epoch 0 had left after the look, at 2 ranks
    assert state["world_size"] == 2 and state["epoch"] == 0
    rest = []
    for rank in range(2):
        resumed = ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=rank, world_size=2,
                              even_batches=False)
        resumed.load_state_dict(state)
        rest += [k for batch in _keys(resumed) for k in batch]
    whole = ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=0, world_size=1)
    assert sorted(peek + rest) == sorted(k for batch in _keys(whole) for k in batch)  # each sample once


def test_a_world_that_changes_after_iterating_as_one_rank_of_several_is_an_error(
        packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loader = ShardLoader(str(packed), batch_size=8)
    list(loader)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(LoaderError, match=r"iterated as rank 1 of 2, but this process is now rank 1 of 3: build the "
                                          r"loader after init_process_group, or pass rank= and world_size="):
        list(loader)


def test_a_world_that_changes_during_an_iteration_is_an_error(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = ShardLoader(str(packed), batch_size=8)
    it = iter(loader)
    next(it)  # still open: its batches are rank 0 of 1's
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(LoaderError, match=r"iterated as rank 0 of 1, but this process is now rank 1 of 2 while an "
                                          r"iteration was open"):
        len(loader)
    del it


def test_explicit_rank_and_world_are_kept(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = ShardLoader(str(packed), batch_size=8, rank=0, world_size=1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert len(list(loader)) == 9 and loader.config.world_size == 1


def test_local_rank_off_node_zero_without_rank_is_refused(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NODE_RANK", "1")
    with pytest.raises(LoaderError, match="LOCAL_RANK=1 and NODE_RANK=1 but no RANK"):
        ShardLoader(str(packed), batch_size=8)


def test_remaining_counts_the_batches_still_to_come(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=8, keys=True)  # 69 samples: 9 batches
    assert loader.remaining == len(loader) == 9
    it = iter(loader)
    next(it), next(it), next(it)
    assert loader.remaining == 6 and loader.epoch == 0
    state = loader.state_dict()
    del it  # left mid-epoch: the next iteration runs epoch 1, whole
    assert loader.remaining == 9 and loader.epoch == 1
    assert loader.state_dict() == state  # the left epoch's place, for a resume that continues it
    nxt = iter(loader)
    next(nxt)
    assert loader.epoch == 1 and loader.remaining == 8
    del nxt
    resumed = ShardLoader(str(packed), batch_size=8, keys=True)
    resumed.load_state_dict(state)
    assert (resumed.remaining, len(resumed)) == (6, 9) and len(list(resumed)) == 6
    assert resumed.remaining == 9  # the epoch finished: the next one is whole
    elastic = ShardLoader(str(packed), batch_size=5, keys=True)
    elastic.load_state_dict(state)  # 45 samples left, in batches of 5
    assert elastic.remaining == 9 and len(list(elastic)) == 9 and len(elastic) == 14


def test_a_look_at_every_batch_then_a_world_runs_the_next_epoch(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of epoch 0 out but its iterator not run to its end (``islice``): the next
    iteration at the new world runs epoch 1, not 2."""
    import itertools

    loader = ShardLoader(str(packed), batch_size=8, keys=True, seed=5)
    list(itertools.islice(loader, len(loader)))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    want = ShardLoader(str(packed), batch_size=8, keys=True, seed=5, rank=1, world_size=2)
    want.set_epoch(1)
    assert loader.epoch == 1 and _keys(loader) == _keys(want) and loader.epoch == 2


_FORKED_RANK = """
import multiprocessing as mp, os, sys
from shardkit import LoaderError, ShardLoader

def rank(loader, queue):
    os.environ.update(WORLD_SIZE="2", RANK="1")
    try:
        queue.put(f"rank 1 took {sum(1 for _ in loader)} batches")
    except LoaderError as err:
        queue.put(f"LoaderError: {err}")

loader = ShardLoader(sys.argv[1], batch_size=8, num_workers=int(sys.argv[2]))
next(iter(loader))  # a look, with workers, before the ranks are forked (Lightning's ddp_fork)
ctx = mp.get_context("fork")
queue = ctx.Queue()
child = ctx.Process(target=rank, args=(loader, queue))
child.start()
print(queue.get(timeout=60))
child.join(60)
print("parent took", sum(1 for _ in loader), "of", len(loader))
"""


@pytest.mark.parametrize("workers", [2, 0])
def test_a_rank_forked_after_a_look_with_workers_is_refused_and_leaves_the_parent_whole(packed: Path,
                                                                                        workers: int) -> None:
    """A rank forked from the process that looked has that process's workers: laying it out anew
    shut them down from the child ("can only join a child process") and broke the parent's next
    loop. The child is refused in one line; the parent goes on. Without workers there is nothing
    to share: the child reads its rank's share."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k not in LAUNCHER}
    run = subprocess.run([sys.executable, "-c", _FORKED_RANK, str(packed), str(workers)], capture_output=True,
                         text=True, timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    first, second = run.stdout.splitlines()
    if workers:
        assert first.startswith("LoaderError: this loader iterated as rank 0 of 1, but this process is now rank 1 "
                                "of 2, forked from process "), first
    else:
        assert first == "rank 1 took 5 batches"
    assert second == "parent took 9 of 9"


def test_a_world_size_without_a_rank_or_a_world_to_take_it_from_is_an_error(packed: Path) -> None:
    """A DistributedSampler given num_replicas without a rank raises where no process group says
    it; the loader took rank 0 and read half the data without a word."""
    loader = ShardLoader(str(packed), batch_size=8, world_size=2)  # a process group may start before it iterates
    with pytest.raises(LoaderError, match=r"^world_size=2 without rank=, and neither a torch.distributed process "
                                          r"group nor the launcher's RANK says which rank this process is"):
        next(iter(loader))
    ShardLoader(str(packed), batch_size=8, world_size=1).close()  # one rank: nothing to say


def test_a_world_size_without_a_rank_takes_the_launchers_rank(packed: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with ShardLoader(str(packed), batch_size=8, keys=True, world_size=2, shuffle=False) as loader, \
            ShardLoader(str(packed), batch_size=8, keys=True, rank=1, world_size=2, shuffle=False) as given:
        assert _keys(loader) == _keys(given)


def test_a_world_size_in_the_environment_without_a_rank_is_an_error(packed: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # no RANK, no LOCAL_RANK: it read as rank 0
    loader = ShardLoader(str(packed), batch_size=8)  # a process group made before it iterates may say the rank
    with pytest.raises(LoaderError, match=r"^WORLD_SIZE=2 is set but neither RANK nor LOCAL_RANK"):
        next(iter(loader))
