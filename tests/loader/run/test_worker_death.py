"""A loader worker killed by SIGKILL (what the out-of-memory killer sends) ends the iteration
with a LoaderError naming the worker, the signal and the likely fix, wherever the main
thread is when the signal lands: waiting for a batch, in the training step between two batches,
or in close()."""

from __future__ import annotations

import gc
import os
import signal
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.run import deaths


def _loader(packed: Path) -> ShardLoader:
    return ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_val(32), shuffle=False,
                       num_workers=2, prefetch=1)


def _kill(loader: ShardLoader, worker: int = 0) -> int:
    pid: int = loader._supply.dataloader._iterator._workers[worker].pid  # type: ignore[union-attr]
    os.kill(pid, signal.SIGKILL)
    return pid


def _assert_names(err: LoaderError, pid: int) -> None:
    message = str(err)
    assert f"DataLoader worker 0 (pid {pid}) was killed by SIGKILL" in message, message
    assert "out-of-memory" in message and "num_workers=2" in message and "prefetch=1" in message, message


@pytest.mark.timeout(120)
def test_a_worker_killed_while_the_loader_waits_is_named_with_cause_and_fix(packed: Path) -> None:
    loader = _loader(packed)
    batches = iter(loader)
    next(batches)
    pid = _kill(loader)
    with pytest.raises(LoaderError) as info:
        for _ in batches:
            pass
    _assert_names(info.value, pid)
    assert isinstance(info.value.__cause__, RuntimeError)  # torch's own error, kept
    assert str(pid) in str(info.value.__cause__)
    loader.close()  # does not raise; a new iteration starts new workers
    assert sum(1 for _ in loader) == len(loader)
    loader.close()


@pytest.mark.timeout(120)
def test_a_worker_killed_between_batches_surfaces_at_the_next_batch(packed: Path) -> None:
    """torch's SIGCHLD handler raised its RuntimeError in the training step (here: this test's
    loop) when the signal landed there; now the next batch raises the loader's error, at once."""
    loader = _loader(packed)
    batches = iter(loader)
    next(batches)
    pid = _kill(loader)
    step_ended = time.monotonic() + 1.0
    while time.monotonic() < step_ended:  # the training step: the signal lands in this frame
        sum(range(1000))
    asked = time.monotonic()
    with pytest.raises(LoaderError) as info:
        next(batches)
    assert time.monotonic() - asked < 3  # not torch's 5 s status check
    _assert_names(info.value, pid)
    loader.close()
    loader.set_epoch(0)
    assert sum(1 for _ in loader) == len(loader)
    loader.close()
    gone = weakref.ref(loader)
    del loader, batches, info
    gc.collect()
    assert gone() is None  # nothing kept of the death holds the loader (and its shared memory)


@pytest.mark.timeout(120)
def test_close_after_a_worker_is_killed_does_not_raise(packed: Path) -> None:
    """Worker 0 exits during close(), before torch reaps the killed worker 1: its SIGCHLD made
    torch's handler raise worker 1's death from inside torch's shutdown code, so close() raised."""
    loader = _loader(packed)
    batches = iter(loader)
    next(batches)
    handler = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the kill's own signal: handled here, by nobody
    try:
        pid = _kill(loader, worker=1)
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:  # dead, not reaped
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGCHLD, handler)
    loader.close()  # worker 0 exits in here: its signal is handled in torch's shutdown code
    del batches
    assert sum(1 for _ in loader) == len(loader)
    loader.close()


class _Stub:
    def _raise_deferred(self) -> None:
        pass


def _failing() -> Iterator[object]:
    raise ConnectionResetError(104, "Connection reset by peer")  # what fetching a dead worker's descriptor gives
    yield


def test_a_connection_reset_waits_for_the_death_to_show(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel closes a killed worker's sockets before its exit status is readable: the reset
    must not escape as it is while the death is about to show."""
    answers = iter([None, None, LoaderError("DataLoader worker 1 (pid 7) was killed by SIGKILL: ...")])
    monkeypatch.setattr(deaths, "worker_death", lambda _loader: next(answers))
    with pytest.raises(LoaderError, match="worker 1") as info:
        next(deaths._Watched(_failing(), _Stub()))  # type: ignore[arg-type]
    assert isinstance(info.value.__cause__, ConnectionResetError)


def test_a_connection_reset_without_a_death_is_reraised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deaths, "worker_death", lambda _loader: None)
    monkeypatch.setattr(deaths, "DEATH_GRACE_S", 0.05)
    with pytest.raises(ConnectionResetError):
        next(deaths._Watched(_failing(), _Stub()))  # type: ignore[arg-type]


def _read_until_killed(event: deaths.FlagEvent) -> None:
    while True:
        event.is_set()


@pytest.mark.timeout(60)
def test_a_worker_killed_while_it_reads_the_done_event_leaves_it_usable() -> None:
    # Each DataLoader worker reads torch's done event once per batch asked of it. A
    # multiprocessing.Event takes a lock in shared memory to read it, so a worker killed at that
    # moment left it held, and the main process hung for good in set() (close) or is_set()
    # (reporting the death). Here a process reads in a tight loop and is killed 20 times.
    import multiprocessing
    import threading

    context = multiprocessing.get_context("fork")
    event = deaths.DeathSafeContext("fork").Event()
    for _ in range(20):
        reader = context.Process(target=_read_until_killed, args=(event,))
        reader.start()
        time.sleep(0.01)
        os.kill(reader.pid, signal.SIGKILL)  # type: ignore[arg-type]
        reader.join()
        setter = threading.Thread(target=lambda: (event.set(), event.clear()), daemon=True)
        setter.start()
        setter.join(5)
        assert not setter.is_alive()


def test_the_workers_done_event_has_no_lock(packed: Path) -> None:
    loader = _loader(packed)
    try:
        next(iter(loader))
        assert isinstance(loader._supply.dataloader._iterator._workers_done_event, deaths.FlagEvent)  # type: ignore[union-attr]
    finally:
        loader.close()


@pytest.mark.timeout(120)
def test_the_next_iteration_after_a_worker_death_runs_on_new_workers(packed: Path) -> None:
    """As a DataLoader's does: the iteration a death ended raises, the next one runs whole, at
    once (it waited 5 s on the dead worker and raised its death again, until close())."""
    loader = _loader(packed)
    batches = iter(loader)
    next(batches)
    pid = _kill(loader)
    with pytest.raises(LoaderError):
        for _ in batches:
            pass
    began = time.monotonic()
    assert sum(1 for _ in loader) == len(loader)
    assert time.monotonic() - began < 4
    assert pid not in [w.pid for w in loader._supply.dataloader._iterator._workers]  # type: ignore[union-attr]
    loader.close()
