"""What this host gives a process: the cores it may run on, the memory it may still take, how
many processes of its job share the host, and the loader worker count chosen from them
(``num_workers="auto"``)."""

from __future__ import annotations

import os

from shardkit.errors import LoaderError

__all__ = ["LOCAL_RANK_VARIABLES", "MAX_AUTO_WORKERS", "auto_workers", "available_memory", "cores_of_this_process",
           "first_on_host", "local_processes", "usable_cores"]

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
    its cgroup (a container's ``--memory``) leaves less; None where neither can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v2: this process's group
        with open("/proc/self/cgroup") as f:
            group = next((line.strip().split(":", 2)[2] for line in f if line.startswith("0::")), None)
        if group is not None:
            base = "/sys/fs/cgroup" + group.rstrip("/")
            with open(base + "/memory.max") as f:
                limit = f.read().strip()
            if limit != "max":
                with open(base + "/memory.current") as f:
                    found.append(max(0, int(limit) - int(f.read().strip())))
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


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
