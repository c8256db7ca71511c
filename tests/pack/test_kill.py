"""Kill ``shardkit pack`` with SIGKILL (the whole process group, or the parent alone) at random
points and while its workers start, then resume it: only complete files are ever visible, the
resumed pack is byte-identical, and no process or semaphore name is left behind."""

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.pack.resume_checks import check_only_complete_files, visible
from tests.pack.semaphores import mapped_semaphores


def test_kill_at_random_points_then_resume(many_images, reference, tmp_path, pack_semaphores):
    dst = tmp_path / "out"
    rng = random.Random(1234)
    num_shards = sum(name.endswith(".tar") for name in reference)
    kills = 0
    for _ in range(4):
        target = rng.randrange(1, num_shards)
        proc = subprocess.Popen(pack_semaphores.command(many_images, dst), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            present = sum(1 for p in dst.glob("*.tar")) if dst.exists() else 0
            if present >= target:
                time.sleep(rng.uniform(0, 0.05))
                break
            time.sleep(0.002)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        pack_semaphores.remove()  # names of a pool killed while its workers started
        assert "index.json" not in visible(dst) or proc.returncode == 0
        check_only_complete_files(dst, reference)
    assert kills >= 2  # the test really interrupted the pack
    finished = subprocess.run(pack_semaphores.command(many_images, dst), capture_output=True, text=True,
                              timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert visible(dst) == reference
    assert sorted(p.name for p in dst.iterdir()) == sorted(reference)  # state and temporaries gone
    assert not pack_semaphores.left()


def test_kill_9_of_the_whole_group_while_workers_start_then_resume(many_images, reference, tmp_path, pack_semaphores):
    """The one kill that leaves the pool's semaphore names in /dev/shm (see :class:`PackSemaphores`):
    the test removes them, and the re-run finishes the pack and leaves none."""
    dst = tmp_path / "out"
    proc = subprocess.Popen(pack_semaphores.command(many_images, dst), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error, OSError):
                if any("spawn_main" in " ".join(c.cmdline()) for c in parent.children()):
                    break
            time.sleep(0.002)
        assert proc.poll() is None, "the pack ended before its workers started"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    pack_semaphores.remove()
    check_only_complete_files(dst, reference)
    finished = subprocess.run(pack_semaphores.command(many_images, dst), capture_output=True, text=True,
                              timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert visible(dst) == reference
    assert not pack_semaphores.left()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_kill_9_of_the_whole_group_leaves_no_semaphore(many_images, tmp_path, pack_semaphores):
    """``kill -9`` of the process group kills the resource tracker too, so it cannot remove the
    pool's semaphores: the pack removes their names itself once every worker has opened them."""
    dst = tmp_path / "out"
    proc = subprocess.Popen(pack_semaphores.command(many_images, dst, "--max-count", "1"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    try:
        workers: list[psutil.Process] = []
        named: set[str] = set()
        unnamed: set[str] = set()
        deadline = time.monotonic() + 60  # a bound for a regression, not a timing assertion
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error, OSError):
                workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
                named = set().union(set(), *(mapped_semaphores(w.pid) for w in workers))
                unnamed = set().union(set(), *(mapped_semaphores(w.pid, deleted=True) for w in workers))
                if len(workers) == 2 and unnamed and not named:
                    break
            time.sleep(0.01)
        assert proc.poll() is None, "the pack ended before the kill"
        assert len(workers) == 2 and unnamed and not named, f"names still in /dev/shm while packing: {named}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.2)
        assert not [s for s in unnamed if os.path.exists(s)]
        assert not pack_semaphores.left()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_kill_9_of_the_parent_leaves_no_process_or_semaphore(many_images, tmp_path, pack_semaphores):
    """``kill -9`` of the pack process alone (not its group): its workers and the resource
    tracker exit, and the tracker removes the pool's semaphores from /dev/shm."""
    dst = tmp_path / "out"
    proc = subprocess.Popen(pack_semaphores.command(many_images, dst, "--max-count", "1"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    children: list[psutil.Process] = []
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            children = parent.children()
            workers = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
            if len(workers) == 2 and any(dst.glob("*.tar")):
                break
            time.sleep(0.01)
        assert proc.poll() is None and len(workers) == 2, "the pack ended before the kill"
        # named, or already unnamed once every worker opened them (a kill of the whole group needs that)
        semaphores = set().union(*(mapped_semaphores(w.pid) | mapped_semaphores(w.pid, deleted=True) for w in workers))
        assert semaphores
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # Bounded wait (a regression fails here instead of hanging); not a timing assertion.
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"still running after the parent was killed: {alive}"
        deadline = time.monotonic() + 30
        while pack_semaphores.left() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [s for s in semaphores if os.path.exists(s)] and not pack_semaphores.left()
    finally:  # whatever happened, leave no process of this test behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for child in workers:  # the tracker then exits by itself and removes the semaphores
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        for child in psutil.wait_procs(children, timeout=10)[1]:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
