"""CPU time and memory of this process and all its descendants, sampled with ``psutil``.

``resource.getrusage(RUSAGE_CHILDREN)`` only counts children after they exit, and persistent
DataLoader workers do not exit during a timed run, so we sample every process of the tree
instead. CPU time and RSS work wherever psutil does; PSS needs Linux (``/proc/<pid>/smaps_rollup``,
or ``smaps`` on kernels older than 4.14) and is None elsewhere.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

# psutil raises these for a process that exited (or became unreadable) while we looked at it.
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


def _tree(root: int) -> list[psutil.Process]:
    """``root`` and its live descendants; empty if ``root`` itself is gone."""
    try:
        proc = psutil.Process(root)
        return [proc, *proc.children(recursive=True)]
    except _GONE:
        return []


def tree_snapshot(root: int | None = None) -> dict[int, tuple[float, int]]:
    """``{pid: (cpu seconds (user+system), rss bytes)}`` for ``root`` (default: this process)
    and its descendants. Processes that exit while being read are left out.
    """
    snap: dict[int, tuple[float, int]] = {}
    for proc in _tree(os.getpid() if root is None else root):
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                snap[proc.pid] = (cpu.user + cpu.system, proc.memory_info().rss)
        except _GONE:
            continue
    return snap


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of ``pid`` (shared pages split between their users), or None."""
    try:
        pss = getattr(psutil.Process(pid).memory_full_info(), "pss", None)
    except (*_GONE, OSError):
        return None
    return None if pss is None else int(pss)


def descendants(root: int | None = None) -> list[int]:
    """Pids of the live descendants of ``root`` (default: this process)."""
    root = os.getpid() if root is None else root
    return [proc.pid for proc in _tree(root) if proc.pid != root]


@dataclass
class TreeUsage:
    """What a :class:`TreeSampler` measured between ``start`` and ``stop``.

    ``cpu_seconds``: CPU time (user + system) used by the whole tree; ``cores_busy``: that
    divided by wall time (2.0 = two cores fully busy); ``peak_rss_bytes``: the largest sum of
    RSS over the tree seen by a sample (pages shared between forked workers count once per
    process, so this overstates); ``peak_pss_bytes``: the same for PSS (shared pages split
    between their users: the tree's real footprint), None where PSS is not available.
    """

    wall_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    peak_pss_bytes: int | None = None

    @property
    def cores_busy(self) -> float:
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


class TreeSampler:
    """Sample the process tree every ``interval`` seconds in a background thread.

    CPU time is the sum, per pid, of its last-seen CPU time minus its CPU time at ``start`` (0
    for processes born later); a process that exits loses at most one interval of CPU time.

    Example::

        sampler = TreeSampler().start()
        run_workload()
        usage = sampler.stop()   # TreeUsage
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._peak = 0
        self._peak_pss: int | None = None
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _sample(self) -> None:
        snap = tree_snapshot()
        with self._lock:
            for pid, (cpu, _rss) in snap.items():
                self._first.setdefault(pid, 0.0)
                self._last[pid] = cpu
            self._peak = max(self._peak, sum(rss for _cpu, rss in snap.values()))
        pss = [pss_bytes(pid) for pid in snap]
        if pss and all(p is not None for p in pss):
            with self._lock:
                self._peak_pss = max(self._peak_pss or 0, sum(p for p in pss if p is not None))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> TreeSampler:
        """Take the starting snapshot and begin sampling."""
        snap = tree_snapshot()
        self._first = {pid: cpu for pid, (cpu, _rss) in snap.items()}
        self._last = dict(self._first)
        self._peak = sum(rss for _cpu, rss in snap.values())
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="shardkit-bench-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TreeUsage:
        """Take a last sample, stop the thread and return what was measured."""
        self._sample()
        wall = time.perf_counter() - self._t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            cpu = sum(self._last[pid] - self._first.get(pid, 0.0) for pid in self._last)
            return TreeUsage(wall_seconds=wall, cpu_seconds=cpu, peak_rss_bytes=self._peak,
                             peak_pss_bytes=self._peak_pss)


def wait_for_exit(pids: set[int], timeout: float = 30.0) -> bool:
    """Wait until none of ``pids`` is alive (e.g. loader workers shutting down).

    Returns False if some are still alive after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    """False for zombies (exited, not yet reaped): they use no CPU or memory."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess is a subclass: handled here too
        return False
    except psutil.AccessDenied:
        return True
