"""What this host gives a process: the cores it may run on, the memory it may still take, how
many processes of its job share the host, and the loader worker count chosen from them
(``num_workers="auto"``)."""

from __future__ import annotations

import os

from shardkit.errors import LoaderError

__all__ = ["LOCAL_RANK_VARIABLES", "MAX_AUTO_WORKERS", "auto_workers", "available_memory", "cores_of_this_process",
           "first_on_host", "local_processes", "memfd_available", "usable_cores"]

#: The most workers ``"auto"`` picks: past it, more processes add memory and switching; the
#: measured machines (2 and 16 cores) are far below it.
MAX_AUTO_WORKERS = 32


def usable_cores() -> int:
    """Cores this process may run on (``sched_getaffinity``, so containers' cpusets count), else
    ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory this process may still take: the kernel's ``MemAvailable``, or less where
    a memory cgroup above it (a container's ``--memory``; v2 or v1) leaves less, its reclaimable
    page cache counted as free; None where none of them can be read."""
    found = [n for n in (_meminfo_available(), *_cgroup_room()) if n is not None]
    return min(found) if found else None


def memfd_available() -> bool:
    """Whether this process can make ``memfd_create`` files (Linux, and no sandbox forbidding
    it): the loader's shared memory then lies outside /dev/shm."""
    make = getattr(os, "memfd_create", None)
    if make is None:
        return False
    try:
        os.close(make("shardkit-probe", os.MFD_CLOEXEC))
    except OSError:
        return False
    return True


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _stat(text: str | None, key: str) -> int:
    """The value of ``key`` in a cgroup ``memory.stat`` text (0 where absent)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _meminfo_available() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_room() -> list[int]:
    """What each limited memory cgroup of this process, and each one above it, leaves: its limit
    less its usage, less the inactive page cache in it (reclaimed before anything is killed)."""
    room = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":  # v2: one tree, walked up to its root
            root, limit_file, usage_file, cache_key = "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):  # v1: the memory controller's own tree
            root, limit_file, usage_file, cache_key = ("/sys/fs/cgroup/memory", "memory.limit_in_bytes",
                                                       "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        parts = [p for p in path.strip().split("/") if p]
        # inside a container the group's own files are usually at the mount's root
        for depth in range(len(parts), -1, -1):
            folder = "/".join([root, *parts[:depth]])
            limit, usage = _read(f"{folder}/{limit_file}"), _read(f"{folder}/{usage_file}")
            if limit is None or usage is None or not limit.strip().isdigit() or not usage.strip().isdigit():
                continue  # "max" (no limit), or not mounted here
            if int(limit) >= 1 << 60:  # v1's "no limit"
                continue
            cache = _stat(_read(f"{folder}/memory.stat"), cache_key)
            room.append(max(0, int(limit) - int(usage) + cache))
    return room


def local_processes() -> int:
    """Processes of this job on this host: ``LOCAL_WORLD_SIZE`` as torchrun sets it, else 1.

    Raises:
        LoaderError: the variable is set but not a positive integer.
    """
    text = os.environ.get("LOCAL_WORLD_SIZE")
    if text is None:
        return 1
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise LoaderError(f"LOCAL_WORLD_SIZE={text!r} from the launcher is not a positive integer")
    return count


#: Where launchers put a process's rank on its host: torchrun (and Lightning, accelerate,
#: DeepSpeed), Slurm's ``srun``, Open MPI's ``mpirun``; the first one set is taken.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def first_on_host() -> bool:
    """Whether this is its job's first process on this host: the first of
    :data:`LOCAL_RANK_VARIABLES` set is 0, or none is set (a value that is not an integer counts
    as first, so that work done once per host is done rather than skipped)."""
    for name in LOCAL_RANK_VARIABLES:
        text = os.environ.get(name)
        if text is not None and text.strip():
            try:
                return int(text) <= 0
            except ValueError:
                return True
    return True


def cores_of_this_process() -> int:
    """This process's share of the host's cores: its usable cores, divided among the
    ``LOCAL_WORLD_SIZE`` processes of its job when it may run on every core of the host (a
    launcher that binds each rank to its own cores, as ``srun --cpu-bind`` or ``numactl`` do,
    has already given it its share)."""
    usable = usable_cores()
    if usable < (os.cpu_count() or usable):
        return usable
    return max(1, usable // local_processes())


def auto_workers() -> int:
    """``num_workers="auto"``: this process's share of the cores (:func:`cores_of_this_process`)
    less one for the training loop; at least 1, at most :data:`MAX_AUTO_WORKERS`. A launcher that
    neither binds ranks to cores nor sets ``LOCAL_WORLD_SIZE`` (``mp.spawn``) gives every rank
    all the cores: pass ``num_workers`` there."""
    return max(1, min(MAX_AUTO_WORKERS, cores_of_this_process() - 1))
