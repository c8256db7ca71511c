"""What this host gives a process: the cores it may run on, how many processes of its job
share the host, and the loader worker count chosen from them (``num_workers="auto"``)."""

from __future__ import annotations

import os

from shardkit.errors import LoaderError

__all__ = ["MAX_AUTO_WORKERS", "auto_workers", "cores_of_this_process", "local_processes", "usable_cores"]

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
