"""What this host gives a process (:mod:`shardkit.machine`): which process is its job's first here,
the memory it may still take."""

from __future__ import annotations

import pytest

from shardkit import machine
from shardkit.machine import LOCAL_RANK_VARIABLES, available_memory, first_on_host, memfd_available


@pytest.mark.parametrize(("env", "first"), [
    ({}, True),
    ({"LOCAL_RANK": "0"}, True),
    ({"LOCAL_RANK": "1"}, False),
    ({"LOCAL_RANK": "00"}, True),
    ({"SLURM_LOCALID": "3"}, False),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, True),
    ({"LOCAL_RANK": "0", "SLURM_LOCALID": "5"}, True),  # torchrun inside srun: torchrun's own rank
    ({"LOCAL_RANK": "2", "SLURM_LOCALID": "0"}, False),
    ({"LOCAL_RANK": "", "SLURM_LOCALID": "1"}, False),  # an empty one is not set
    ({"LOCAL_RANK": "x"}, True),  # not an integer: the work done once per host is done, not skipped
])
def test_the_first_process_on_a_host_is_told_by_the_launchers_variables(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], first: bool) -> None:
    for name in LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert first_on_host() is first


GIB = 2**30
_MEMINFO = f"MemTotal: {64 * GIB // 1024} kB\nMemAvailable: {40 * GIB // 1024} kB\n"


def _host(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    monkeypatch.setattr(machine, "_read", files.get)


def test_available_memory_is_the_tightest_cgroup_limit_above_the_process_page_cache_counted_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """cgroup v2: a limit on the process's own group or any group above it; the inactive page
    cache a job's reads leave is reclaimed before anything is killed, so it counts as room."""
    _host(monkeypatch, {
        "/proc/meminfo": _MEMINFO,
        "/proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "/sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
        "/sys/fs/cgroup/kubepods/pod1/ctr/memory.current": f"{7 * GIB}\n",
        "/sys/fs/cgroup/kubepods/pod1/memory.max": f"{8 * GIB}\n",
        "/sys/fs/cgroup/kubepods/pod1/memory.current": f"{int(7.9 * GIB)}\n",
        "/sys/fs/cgroup/kubepods/pod1/memory.stat": f"anon {GIB}\ninactive_file {int(6.5 * GIB)}\n",
    })
    assert available_memory() == 8 * GIB - int(7.9 * GIB) + int(6.5 * GIB)


def test_available_memory_reads_cgroup_v1_and_ignores_its_no_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "/proc/meminfo": _MEMINFO,
        "/proc/self/cgroup": "9:cpu:/\n4:memory:/docker/abc\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": f"{4 * GIB}\n",  # a container sees its group at the root
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": f"{3 * GIB}\n",
        "/sys/fs/cgroup/memory/memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB // 2}\n",
    }
    _host(monkeypatch, files)
    assert available_memory() == GIB + GIB // 2
    _host(monkeypatch, {**files, "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert available_memory() == 40 * GIB  # no limit: MemAvailable
    _host(monkeypatch, {})
    assert available_memory() is None


def test_memfd_available_is_a_real_probe() -> None:
    import os

    assert memfd_available() == hasattr(os, "memfd_create")  # no sandbox here forbids it
