"""CPU time and memory of this process and all its descendants, read from ``/proc``.

``resource.getrusage(RUSAGE_CHILDREN)`` only counts children after they exit, and persistent
DataLoader workers do not exit during a timed run, so we sample ``/proc/<pid>/stat`` of every
process of the tree instead. Linux only; elsewhere the sampler reports ``None``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat(pid: int) -> tuple[int, float, int] | None:
    """``(ppid, cpu seconds (user+system), rss bytes)`` of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    ppid, utime, stime, rss_pages = int(rest[1]), int(rest[11]), int(rest[12]), int(rest[21])
    return ppid, (utime + stime) / _TICK, rss_pages * _PAGE


def tree_snapshot(root: int | None = None) -> dict[int, tuple[float, int]]:
    """``{pid: (cpu seconds, rss bytes)}`` for ``root`` (default: this process) and descendants.

    Returns an empty dict where ``/proc`` is not available.
    """
    root = os.getpid() if root is None else root
    if not os.path.isdir("/proc"):
        return {}
    parents: dict[int, int] = {}
    info: dict[int, tuple[float, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is not None:
            parents[int(name)] = st[0]
            info[int(name)] = (st[1], st[2])
    tree, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return {pid: info[pid] for pid in tree if pid in info}


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of ``pid`` (shared pages split between their users), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def descendants(root: int | None = None) -> list[int]:
    """Pids of the live descendants of ``root`` (default: this process)."""
    root = os.getpid() if root is None else root
    return [pid for pid in tree_snapshot(root) if pid != root]


@dataclass
class TreeUsage:
    """What a :class:`TreeSampler` measured between ``start`` and ``stop``.

    ``cpu_seconds``: CPU time (user + system) used by the whole tree; ``cores_busy``: that
    divided by wall time (2.0 = two cores fully busy); ``peak_rss_bytes``: the largest sum of
    RSS over the tree seen by a sample (pages shared between forked workers count once per
    process, so this overstates); ``peak_pss_bytes``: the same for PSS (shared pages split
    between their users: the tree's real footprint), None where ``smaps_rollup`` is missing.
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
        self._thread = threading.Thread(target=self._loop, name="shardkit-bench-sampler", daemon=True)
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
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] != b"Z"
