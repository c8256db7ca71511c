"""ShardLoader's life cycle: set_epoch after a resume, errors from workers, close()."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.run.stream import WorkerTraceback


def _loader(ds: Path, **kw: object) -> ShardLoader:
    args: dict[str, object] = {"batch_size": 8, "transform": transforms.imagenet_train(32), "keys": True, "seed": 5}
    args.update(kw)
    return ShardLoader(str(ds), **args)  # type: ignore[arg-type]


def _keys(loader: ShardLoader) -> list[list[str]]:
    return [list(k) for *_, k in loader]


def test_set_epoch_after_load_state_dict_keeps_the_resume_point(packed: Path, caplog: pytest.LogCaptureFixture) -> None:
    reference = _loader(packed)
    reference.set_epoch(1)
    full = _keys(reference)
    first = _loader(packed)
    first.set_epoch(1)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    resumed = _loader(packed)
    resumed.load_state_dict(state)
    got: list[list[str]] = []
    for epoch in range(resumed.epoch, 2):  # the usual training loop
        resumed.set_epoch(epoch)
        got += _keys(resumed)
    assert got == full[3:]
    other = _loader(packed)
    other.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        other.set_epoch(0)  # another epoch: starts it from the beginning, said
    assert other.state_dict()["epoch"] == 0 and other.state_dict()["batches_consumed"] == 0
    assert [r.getMessage() for r in caplog.records] == [
        "shardkit: set_epoch(0) right after load_state_dict drops its resume point (epoch 1, batch 3): epoch 0 "
        "runs from its start; set_epoch(loader.epoch) resumes where the state stopped"]
    caplog.clear()
    other.set_epoch(1)  # nothing loaded is dropped any more
    assert caplog.text == ""
    within = _loader(packed)
    it = iter(within)
    next(it)
    within.load_state_dict(state)  # loaded while an iteration is open: the next one resumes it
    within.set_epoch(2)
    assert "drops its resume point (epoch 1, batch 3)" in caplog.text
    caplog.clear()
    again = _loader(packed)
    again.load_state_dict(state)
    again.set_epoch(1)
    next(iter(again))
    again.set_epoch(1)  # after iterating, set_epoch restarts the epoch as always
    assert again.state_dict()["batches_consumed"] == 0
    assert caplog.text == ""


def test_set_epoch_during_an_iteration_is_the_next_ones(packed: Path) -> None:
    """As a DataLoader whose DistributedSampler gets set_epoch mid-iteration: the open iteration
    goes on with its epoch, and the next one runs the epoch set, whether the open one ran whole
    or was left; its state meanwhile is the open iteration's."""
    def keys_of(epoch: int) -> list[list[str]]:
        ref = _loader(packed)
        ref.set_epoch(epoch)
        return _keys(ref)

    epoch0, epoch5, epoch7 = keys_of(0), keys_of(5), keys_of(7)
    loader = _loader(packed)
    got = []
    for i, (*_, k) in enumerate(loader):
        got.append(list(k))
        if i == 1:
            loader.set_epoch(5)
            # until the open iteration ends, its own place: a checkpoint now resumes its batches to come
            assert loader.epoch == 0 and loader.state_dict()["batches_consumed"] == 2
    assert got == epoch0  # the open iteration went on with epoch 0
    assert loader.epoch == 5 and loader.remaining == len(loader)
    for i, (*_, k) in enumerate(loader):
        assert list(k) == epoch5[i]
        if i == 2:
            loader.set_epoch(7)
            break  # left mid-epoch: the next iteration runs the epoch set, from its start
    assert loader.epoch == 7 and loader.state_dict()["epoch"] == 7 and loader.state_dict()["batches_consumed"] == 0
    assert _keys(loader) == epoch7


def test_a_state_loaded_during_an_iteration_is_where_the_next_one_starts(packed: Path) -> None:
    """load_state_dict while an iteration is open: that iteration goes on as it was, and the next
    one resumes from the state (it was lost: the open iteration's next batch put its place back)."""
    ref = _loader(packed)
    full = _keys(ref)
    saver = _loader(packed)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = saver.state_dict()  # epoch 0, 3 batches delivered
    loader = _loader(packed)
    got = []
    for i, (*_, k) in enumerate(loader):
        got.append(list(k))
        if i == 4:
            loader.load_state_dict(state)
    assert got == full  # the open iteration ran on
    assert loader.epoch == 0 and loader.remaining == len(full) - 3
    assert _keys(loader) == full[3:]


def test_set_epoch_and_state_during_an_iteration_edge_cases(packed: Path) -> None:
    """The usual resume loop run while an iteration is open keeps the state's resume point;
    set_epoch of the open iteration's own epoch while it has batches to deliver changes nothing
    (the next one runs the epoch after it), once they are all out it runs that epoch again; the
    last call wins; close() ends the open iteration, so an epoch set before or after it holds at
    once; a copy made mid-iteration has none open."""
    import pickle

    ref = _loader(packed)
    full = _keys(ref)
    keys_of_0 = full
    saver = _loader(packed)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = saver.state_dict()

    loader = _loader(packed)
    opened: Any = iter(loader)
    next(opened)
    loader.load_state_dict(state)
    loader.set_epoch(loader.epoch)  # the resume loop's first step: keeps the resume point
    assert loader.state_dict() == state
    opened.close()
    assert _keys(loader) == full[3:]

    seen = _loader(packed)
    epochs = []
    for _ in range(3):
        it = iter(seen)
        next(it)
        seen.set_epoch(seen.epoch)  # "I am in this epoch": nothing to change
        epochs.append(seen.state_dict()["epoch"])
        list(it)
    assert epochs == [0, 1, 2] and seen.epoch == 3

    closed = _loader(packed)
    it = iter(closed)
    next(it)
    closed.set_epoch(3)
    closed.close()
    assert closed.epoch == 3 and closed.state_dict()["epoch"] == 3
    closed.set_epoch(4)  # closed: no iteration open, applies at once
    assert closed.epoch == 4 and closed.state_dict()["batches_consumed"] == 0
    del it

    held = _loader(packed)  # an evaluation that keeps its iterator and takes len() batches
    for _ in range(3):
        held.set_epoch(0)
        it = iter(held)
        assert [list(next(it)[-1]) for _ in range(len(held))] == keys_of_0
        assert held.epoch == 0 and held.remaining == 0

    last = _loader(packed)
    gen: Any = iter(last)
    next(gen)
    last.set_epoch(5)
    last.set_epoch(0)  # the last call wins: epoch 0 again next
    gen.close()
    assert _keys(last) == keys_of_0

    source = _loader(packed, num_workers=0)
    it = iter(source)
    next(it)
    copy = pickle.loads(pickle.dumps(source))
    copy.set_epoch(2)
    assert copy.epoch == 2 and copy.state_dict()["epoch"] == 2


def test_worker_errors_keep_type_message_and_where(packed: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    shard = ds / "shard-000001.tar"
    loader = _loader(ds, shuffle=False, num_workers=2)
    shard.write_bytes(shard.read_bytes()[:2000])  # cut short once the loader has checked its files
    with pytest.raises(LoaderError) as info:
        _keys(loader)
    err = info.value
    assert "shard-000001.tar" in err.where and "Traceback" not in str(err) and "truncated" in err.message
    assert isinstance(err.__cause__, WorkerTraceback) and "Traceback" in str(err.__cause__)


def test_close_stops_the_workers_and_the_loader_still_works_after(packed: Path) -> None:
    with _loader(packed, num_workers=2) as loader:
        next(iter(loader))
        workers = list(loader._supply.dataloader._iterator._workers)  # type: ignore[union-attr]
        assert len(workers) == 2 and all(w.is_alive() for w in workers)
    assert not any(w.is_alive() for w in workers)
    assert not set(multiprocessing.active_children()) & set(workers)
    loader.close()  # idempotent
    assert len(_keys(loader)) == len(loader)  # a later epoch starts new workers
    loader.close()
    plain = _loader(packed)
    next(iter(plain))
    assert plain.reader._open
    plain.close()
    assert not plain.reader._open


@pytest.mark.parametrize("kw", [{"num_workers": 2}, {"num_workers": 1, "feeders": 1},
                                {"num_workers": 2, "read_ahead": True}])
def test_a_loader_dropped_without_close_stops_its_processes_at_once(packed: Path, kw: dict[str, int]) -> None:
    """As a DataLoader's do: no reference cycle keeps a dropped loader (and its workers or feeders)
    alive until Python's cycle collector runs, which may be much later."""
    import gc
    import time

    import psutil

    gc.collect()
    me = psutil.Process()
    lasting = {p.pid for p in me.children(recursive=True)}  # the forkserver and resource tracker stay
    gc.disable()  # only reference counting may free the loader here
    try:
        loader = _loader(packed, **kw)
        loader.sampler.set_epoch(0)  # as Lightning and DDP scripts do: the loader keeps its sampler
        batches = iter(loader)
        next(batches), next(batches)
        del batches, loader
        deadline = time.monotonic() + 10
        while {p.pid for p in me.children(recursive=True)} - lasting and time.monotonic() < deadline:
            time.sleep(0.05)
        # a forkserver started for the feeders (a child; the feeders are its children) and the
        # resource tracker last as long as this process, as multiprocessing's do
        servers = {p.pid for p in me.children() if any(s in " ".join(p.cmdline())
                                                        for s in ("forkserver", "resource_tracker"))}
        left = [p for p in me.children(recursive=True) if p.pid not in lasting | servers]
    finally:
        gc.enable()
    assert left == []


def test_a_loader_dropped_without_close_closes_its_shard_files(packed: Path) -> None:
    """A loader reading in this process (num_workers=0) holds its shards' descriptors; dropped
    without close(), they close with it (they stayed open for the life of the process, and a
    process that left loaders to the garbage collector ran out of descriptors)."""
    import contextlib
    import gc
    import os

    def shards_open() -> list[str]:
        names = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                names.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [n for n in names if n.startswith(os.path.realpath(packed)) and n.endswith(".tar")]

    assert shards_open() == []
    gc.disable()  # only reference counting may free the loader here
    try:
        for whole in (True, False):
            loader = _loader(packed)
            batches = iter(loader)
            next(batches)
            assert shards_open()
            if whole:
                list(batches)
            del batches, loader
            assert shards_open() == []
    finally:
        gc.enable()


def test_the_route_hears_when_the_workers_run_before_the_first_batch(packed: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Route.workers_started comes once the worker processes exist (the GPU route compiles its
    kernel in a thread then, with no fork to follow) and before the first batch is taken."""
    before = len(multiprocessing.active_children())  # any left by earlier tests
    loader = _loader(packed, num_workers=2)
    seen: list[tuple[int, int]] = []
    delivered: list[int] = []
    monkeypatch.setattr(loader.route, "workers_started",
                        lambda: seen.append((len(multiprocessing.active_children()) - before, len(delivered))))
    try:
        for batch in loader:
            delivered.append(len(batch[0]))
        assert seen == [(2, 0)]  # once, the two workers running, no batch taken yet
        assert delivered
    finally:
        loader.close()


def test_an_iteration_an_error_ended_says_so_instead_of_ending_the_epoch(packed: Path) -> None:
    """After a transform's error the same iterator raised StopIteration: the epoch looked done
    after one batch of nine. DataLoader's iterator goes on; this one names the error it ended with."""
    calls = {"n": 0}

    def flaky(image: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 12:
            raise ValueError("flaky")
        return image[:, :2, :2].clone()

    loader = ShardLoader(str(packed), batch_size=8, transform=flaky)
    it = iter(loader)
    assert len(it) == len(loader)  # as a DataLoader iterator's
    next(it)
    with pytest.raises(ValueError, match="flaky"):
        next(it)
    with pytest.raises(LoaderError, match=r"this iteration already ended with an error \(ValueError: flaky"):
        next(it)
    assert len(list(loader)) == len(loader)  # a new iteration: a whole epoch


_CTRL_C = """
import os, signal, sys
from shardkit import ShardLoader, transforms
loader = ShardLoader(sys.argv[1], batch_size=4, num_workers=2, transform=transforms.imagenet_train(16))
try:
    for i, _ in enumerate(loader):
        if i == 2:
            os.killpg(os.getpgrp(), signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
except KeyboardInterrupt:
    print("interrupted at", loader.state_dict()["batches_consumed"], flush=True)
print("next epoch", sum(1 for _ in loader), "of", len(loader), flush=True)
"""


def test_ctrl_c_in_a_terminal_leaves_the_workers_for_the_next_loop(packed: Path) -> None:
    """Ctrl-C signals the terminal's whole process group: the workers died of it, and a loop that
    caught the KeyboardInterrupt (to save, or to go on) failed at its next epoch with a traceback
    from torch's queue. The workers ignore it; the training process still gets it."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _CTRL_C, str(packed)], capture_output=True, text=True, timeout=120,
                         start_new_session=True)  # a process group of its own, as a terminal's job
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "interrupted at 3" and lines[1] == f"next epoch {lines[1].split()[-1]} of {lines[1].split()[-1]}"


def test_workers_start_with_ctrl_c_blocked_then_ignore_it_and_the_loop_s_mask_is_kept(
        packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C to the process group while the workers start killed them (they ignored it only
    from their init on): they start with SIGINT blocked, then ignore it, unblocked; the training
    loop's own signal mask is as before."""
    import os
    import signal

    from shardkit.loader.run import workers as worker_module

    init = worker_module._init_worker
    seen = tmp_path / "masks"
    seen.mkdir()

    def recording_init(worker_id: int) -> None:  # runs in the forked worker
        at_start = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        init(worker_id)
        after = (signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()),
                 signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
        (seen / str(os.getpid())).write_text(repr((at_start, *after)))

    monkeypatch.setattr(worker_module, "_init_worker", recording_init)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with ShardLoader(str(packed), batch_size=8, num_workers=2) as loader:
        next(iter(loader))
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert sorted(path.read_text() for path in seen.iterdir()) == ["(True, False, True)"] * 2
