"""Forked children never collect what they inherited (:mod:`shardkit.loader.run.forks`): a child
that freed this process's pinned or CUDA memory would call CUDA, which aborts a forked child."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shardkit.loader.run import forks
from shardkit.loader.run.stream import raise_failures


def _where_collected(make_garbage_then_fork: Callable[[Callable[[], object]], None]) -> bytes:
    """Run ``make_garbage_then_fork(make)`` with the collector off, where ``make()`` makes a
    cycle whose finaliser writes ``p`` (collected in this process) or ``c`` (in a child) to a pipe,
    and each forked child collects at once; then collect here. Returns what the pipe got."""
    parent, (read_end, write_end) = os.getpid(), os.pipe()

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            os.write(write_end, b"p" if os.getpid() == parent else b"c")

    gc.collect()
    gc.disable()  # nothing collects but the calls below
    try:
        make_garbage_then_fork(Cycle)
        assert gc.get_freeze_count() == 0
        gc.collect()
    finally:
        gc.enable()
        os.close(write_end)
    try:
        return os.read(read_end, 16)
    finally:
        os.close(read_end)


def _fork_and_collect_in_the_child() -> None:
    pid = os.fork()
    if pid == 0:  # a worker: its collector runs
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)


def test_a_forked_worker_never_collects_what_it_inherited() -> None:
    """Garbage made before the source is opened, a worker forked in ``iter``: collected here only."""

    class Source:
        def __iter__(self) -> Iterator[Any]:
            _fork_and_collect_in_the_child()
            return iter([])

    def scenario(make: Callable[[], object]) -> None:
        make()
        assert list(raise_failures(Source())) == []

    assert _where_collected(scenario) == b"p"


def test_garbage_made_while_the_workers_start_stays_with_this_process() -> None:
    """Another thread (a GPU loader's prefetcher, say) makes garbage after ``iter`` began and
    before the fork: the fork itself freezes it, so the child does not collect it either."""
    forks.freeze_forked_children()

    def scenario(make: Callable[[], object]) -> None:
        maker = threading.Thread(target=make)
        maker.start()
        maker.join()
        _fork_and_collect_in_the_child()  # a plain fork: another library's DataLoader, say

    assert _where_collected(scenario) == b"p"


def test_a_programs_own_freeze_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 12)  # the program froze some objects itself
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    forks._before_fork()
    forks._after_fork_in_parent()
    assert calls == []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)
    forks._before_fork()
    forks._after_fork_in_parent()
    assert calls == ["freeze", "unfreeze"]


def test_the_hooks_are_registered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(forks, "_installed", False)
    monkeypatch.setattr(os, "register_at_fork", lambda **hooks: registered.append(hooks))
    forks.freeze_forked_children()
    forks.freeze_forked_children()
    assert len(registered) == 1
