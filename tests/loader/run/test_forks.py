"""Forked children never collect what they inherited (:mod:`shardkit.loader.run.forks`): a child
that freed this process's pinned or CUDA memory would call CUDA, which aborts a forked child."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
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
    frozen = gc.get_freeze_count()  # 0, or Python's own at start-up (3.12)
    gc.disable()  # nothing collects but the calls below
    try:
        make_garbage_then_fork(Cycle)
        assert os.getpid() == parent, "a forked child returned into the test"
        assert gc.get_freeze_count() == frozen
    finally:
        if os.getpid() != parent:  # pragma: no cover - never let a child go on with the test session
            os._exit(1)
        gc.collect()  # the garbage goes while its pipe is open, even if the scenario failed
        gc.enable()
        os.close(write_end)
    try:
        return os.read(read_end, 16)
    finally:
        os.close(read_end)


def _fork_and_collect_in_the_child() -> None:
    pid = os.fork()
    if pid == 0:  # a worker: its collector runs
        try:
            gc.collect()
        finally:  # whatever happens, the child never returns into the test session
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
    """Garbage another thread made, then a plain fork (another library's DataLoader: no loader's
    ``iter`` around it): the fork itself freezes the garbage, so the child does not collect it."""
    forks.freeze_forked_children()

    def scenario(make: Callable[[], object]) -> None:
        maker = threading.Thread(target=make)
        maker.start()
        maker.join()
        _fork_and_collect_in_the_child()  # a plain fork: another library's DataLoader, say

    assert _where_collected(scenario) == b"p"


def test_garbage_made_while_a_later_fork_hook_waits_stays_with_this_process() -> None:
    """logging's fork hook, registered before ours, runs after it and waits for logging's lock:
    a thread holding that lock makes garbage after the freeze, before the fork. The child must
    not collect it either (its collector stays off until it has frozen that garbage too)."""
    import logging
    import sys
    import time

    forks.freeze_forked_children()
    forker = threading.get_ident()

    def forker_waits_in_loggings_hook() -> bool:
        frame = sys._current_frames().get(forker)
        while frame is not None:
            if frame.f_code.co_name in ("_prepareFork", "_acquireLock"):  # logging's hook: 3.12, 3.11
                return True
            frame = frame.f_back
        return False

    def scenario(make: Callable[[], object]) -> None:
        holding, done = threading.Event(), threading.Event()

        def hold_loggings_lock() -> None:
            with logging._lock:  # type: ignore[attr-defined]
                holding.set()
                deadline = time.monotonic() + 10
                while not forker_waits_in_loggings_hook() and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert forker_waits_in_loggings_hook()
                make()  # garbage made after the freeze, while the fork waits
            done.set()

        holder = threading.Thread(target=hold_loggings_lock)
        holder.start()
        holding.wait()
        _fork_and_collect_in_the_child()
        holder.join()
        assert done.is_set()

    assert _where_collected(scenario) == b"p"


def test_forks_from_several_threads_at_once_leave_the_parent_as_it_was() -> None:
    """Two loaders opening their workers at once: the forks' hooks interleave. The parent must get
    its collector back on with nothing frozen, and every child its collector on."""
    forks.freeze_forked_children()
    frozen = gc.get_freeze_count()  # 0, or Python's own at start-up (3.12)
    children_with_the_collector_off = []

    def forker() -> None:
        for _ in range(30):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 1
                try:
                    code = 0 if gc.isenabled() else 1
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            children_with_the_collector_off.append(os.waitstatus_to_exitcode(status))

    threads = [threading.Thread(target=forker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(children_with_the_collector_off) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen


_WINDOW_WITH_THE_COLLECTOR_ON = """
import gc, logging, os, sys, threading, time
parent, (r, w) = os.getpid(), os.pipe()
class Cycle:
    def __init__(self): self.me = self
    def __del__(self): os.write(w, b"p" if os.getpid() == parent else b"c")
def allocate():  # an earlier fork hook of the child (as threading's): it allocates, the collector may run
    gc.set_threshold(1)
    [[] for _ in range(50)]
os.register_at_fork(after_in_child=allocate)
from shardkit.loader.run import forks
forks.freeze_forked_children()
forker = threading.get_ident()
def waiting():
    frame = sys._current_frames().get(forker)
    while frame is not None:
        if frame.f_code.co_name in ("_prepareFork", "_acquireLock"):
            return True
        frame = frame.f_back
    return False
def hold():
    with logging._lock:
        ready.set()
        while not waiting():
            time.sleep(0.001)
        Cycle()  # garbage made after the freeze, while the fork waits in logging's hook
ready = threading.Event()
holder = threading.Thread(target=hold)
holder.start()
ready.wait()
gc.set_threshold(10**6)  # the collector on; this process does not collect while the fork waits
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
holder.join()
gc.collect()
os.close(w)
print(os.read(r, 16).decode())
"""


def test_a_child_whose_collector_is_on_never_runs_it_before_it_has_frozen_what_it_inherited() -> None:
    """In a fresh interpreter, with the collector on: the child's earlier fork hooks allocate
    before ours has frozen the garbage made while the fork waited; the collector must stay off
    until then (this fails if the before-hook does not switch it off)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _WINDOW_WITH_THE_COLLECTOR_ON], capture_output=True, text=True,
                         timeout=60, check=True, cwd=Path(forks.__file__).parents[3])
    assert out.stdout.strip() == "p", out.stderr


def test_the_parent_only_switches_its_collector_off_and_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent freezes and unfreezes nothing (a program's own freeze is its own); the child
    freezes everything it inherited before its collector comes back on."""
    calls: list[str] = []
    for name in ("freeze", "unfreeze", "disable", "enable"):
        monkeypatch.setattr(gc, name, lambda name=name: calls.append(name))
    monkeypatch.setattr(gc, "isenabled", lambda: True)
    monkeypatch.setattr(forks, "_inherited", [])  # the child's hook runs here: it keeps nothing for good
    forks._before_fork()
    forks._after_fork_in_parent()
    assert calls == ["disable", "enable"]
    calls.clear()
    forks._before_fork()
    forks._after_fork_in_child()
    assert calls == ["disable", "freeze", "enable"]


_OWN_FREEZE = """
import gc, os
parent, (r, w) = os.getpid(), os.pipe()
class Cycle:
    def __init__(self): self.me = self
    def __del__(self): os.write(w, b"p" if os.getpid() == parent else b"c")
from shardkit.loader.run import forks
forks.freeze_forked_children()
kept = [[] for _ in range(10)]
gc.freeze()  # the program's own
frozen = gc.get_freeze_count()
gc.disable()
Cycle()  # garbage made after the program's freeze
pid = os.fork()
if pid == 0:  # a worker: its collector runs
    try:
        gc.collect()
    finally:
        os._exit(0)
os.waitpid(pid, 0)
kept_its_freeze = gc.get_freeze_count() == frozen
gc.collect()
os.close(w)
print(kept_its_freeze, os.read(r, 16).decode())
"""


def test_a_child_of_a_program_that_froze_objects_itself_never_collects_what_it_inherited() -> None:
    """A program (or a library it imports) called ``gc.freeze()`` itself: it keeps its freeze, and
    garbage made after it is still never collected in a forked child. (In a fresh interpreter: a
    test process's own heap is never frozen and unfrozen wholesale.)"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _OWN_FREEZE], capture_output=True, text=True, timeout=60,
                         cwd=Path(forks.__file__).parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "p"], (out.stdout, out.stderr)


def test_a_collector_the_program_switched_off_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)
    for name in ("freeze", "unfreeze", "disable", "enable"):
        monkeypatch.setattr(gc, name, lambda name=name: calls.append(name))
    monkeypatch.setattr(gc, "isenabled", lambda: False)
    monkeypatch.setattr(forks, "_inherited", [])
    forks._before_fork()
    forks._after_fork_in_parent()
    forks._before_fork()
    forks._after_fork_in_child()
    assert "enable" not in calls


def test_a_fork_its_before_hook_did_not_count_leaves_the_count_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A before-hook interrupted before it counted its fork (an exception in it is printed and the
    fork goes on): the after-hook must not take the count below 0, which would leave the collector
    off after every later fork."""
    calls: list[str] = []
    for name in ("freeze", "unfreeze", "disable", "enable"):
        monkeypatch.setattr(gc, name, lambda name=name: calls.append(name))
    forks._after_fork_in_parent()
    assert forks._forking == 0 and calls == []
    monkeypatch.setattr(gc, "isenabled", lambda: True)
    forks._before_fork()
    forks._after_fork_in_parent()
    assert forks._forking == 0 and calls == ["disable", "enable"]


def test_the_hooks_are_registered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(forks, "_installed", False)
    monkeypatch.setattr(os, "register_at_fork", lambda **hooks: registered.append(hooks))
    forks.freeze_forked_children()
    forks.freeze_forked_children()
    assert len(registered) == 1


def test_a_child_keeps_the_registered_holders_alive() -> None:
    """A holder registered with keep_in_forked_children (what owns pinned or CUDA memory) stays
    alive in a child that drops the last reference it sees and collects; anything else is the
    child's to free."""

    class Holder:
        pass

    kept, other, before = Holder(), Holder(), list(forks._inherited)
    forks.keep_in_forked_children(kept)
    refs, holding = (weakref.ref(kept), weakref.ref(other)), [kept, other]
    del kept, other
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops the only references it sees, and collects
        try:
            holding.clear()
            gc.collect()
            os.write(write_end, bytes([refs[0]() is not None, refs[1]() is not None]))
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    try:
        assert os.read(read_end, 2) == bytes([True, False])
    finally:
        os.close(read_end)
    assert forks._inherited == before  # the parent holds no more than before
    holding.clear()
    assert refs[0]() is None  # nor does the registry keep it alive here


def test_a_loader_and_a_copy_of_it_register_what_holds_their_memory(packed: Any) -> None:
    """A loader's epoch runner (its route, workers and kept delivery) is among what forked children
    keep alive once the loader has run, and so is a pickled copy's."""
    import pickle

    from shardkit import ShardLoader, transforms
    from shardkit.loader.run.epoch_run import EpochRun

    def registered(loader: ShardLoader) -> bool:
        return any(isinstance(h, EpochRun) and h.route is loader.route for h in forks._holders)

    with ShardLoader(str(packed), batch_size=8, transform=transforms.imagenet_train(32), num_workers=1) as loader:
        next(iter(loader))
        assert registered(loader)
        loader.close()  # a loader pickles with its workers stopped
        copy = pickle.loads(pickle.dumps(loader))
        try:
            assert registered(copy)
        finally:
            copy.close()


_STARTUP_FREEZE = """
import gc, os, sys
gc.freeze()  # as Python 3.12 starts: a few hundred objects frozen before the program runs
parent, (r, w) = os.getpid(), os.pipe()
class Cycle:
    def __init__(self): self.me = self
    def __del__(self): os.write(w, b"p" if os.getpid() == parent else b"c")
def collect_in_worker(image):
    gc.collect()  # a worker's collector runs, as it does once the worker allocates
    return image
from shardkit import ShardLoader
loader = ShardLoader(sys.argv[1], batch_size=4, transform=collect_in_worker, num_workers=2, seed=1)
gc.disable()
Cycle()  # garbage this process has not collected yet when the loader forks its workers
batches = sum(1 for _ in loader)
gc.enable()
gc.collect()
os.close(w)
print(batches, os.read(r, 16).decode())
"""


def test_a_loaders_workers_never_collect_what_they_inherited_after_a_start_up_freeze(packed: Path) -> None:
    """Python 3.12 starts with objects frozen (``gc.get_freeze_count()`` is 375 on 3.12.1): hooks
    that stood aside for any freeze protected no worker there. Here the freeze is made by hand in a
    fresh interpreter, and each worker collects: the garbage is collected by this process alone."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _STARTUP_FREEZE, str(packed)], capture_output=True, text=True,
                         timeout=120, cwd=Path(forks.__file__).parents[3])
    assert out.returncode == 0, out.stderr
    batches, where = out.stdout.split()
    assert int(batches) > 0 and where == "p", (out.stdout, out.stderr)
