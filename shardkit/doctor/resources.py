"""Host resources against a loader plan: shared memory, open-file limit, CPU cores."""

from __future__ import annotations

import os
import shutil

from shardkit.doctor.findings import Finding, LoaderPlan
from shardkit.machine import available_memory, memfd_available, usable_cores

SHM = "/dev/shm"
#: Below this soft ``RLIMIT_NOFILE``, DataLoader workers hit "Too many open files" (torch shares
#: worker tensors through file descriptors); per worker we count its shared-memory segments, its
#: open shards and torch's own, generously.
MIN_FILES, FILES_PER_WORKER = 1024, 64


def _gib(n: float) -> str:
    """``n`` bytes in GiB (TiB from 1,024 of them, with thousands separators), or in MiB below
    one GiB (0.0 GiB says nothing).

    >>> _gib(3 * 2**29), _gib(12 * 2**50), _gib(2**20)
    ('1.5 GiB', '12,288.0 TiB', '1 MiB')
    """
    if n >= 2**40:
        return f"{n / 2**40:,.1f} TiB"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_shm(plan: LoaderPlan, free: int | None, *, memfd: bool = False,
              available: int | None = None) -> Finding:
    """The shared memory ``plan``'s batches take: with ``memfd`` (Linux) they are ``memfd_create``
    segments, outside /dev/shm, and ``available`` bytes of memory are what bounds them; without,
    ``free`` bytes in /dev/shm (``None``: there is none) do."""
    need = plan.shm_bytes
    batches = f"{_workers(plan)} x {plan.prefetch + 3} batches of {plan.batch_size}x3x{plan.size}x{plan.size} uint8"
    if memfd:
        detail = f"up to {_gib(need)} ({batches}) in memfd segments, not in /dev/shm"
        if available is None:
            return Finding("shared memory", "ok", detail)
        detail += f"; {_gib(available)} of memory available"
        if need > available:
            return Finding("shared memory", "problem", detail + ": workers will be killed for memory",
                           fix="fewer --workers or a smaller --batch-size, or more memory for this process "
                               "(docker run --memory=…)")
        if need > available // 2:
            return Finding("shared memory", "note", detail + ": more than half of it; training needs the rest",
                           fix="fewer --workers or a smaller --batch-size if the training process runs short")
        return Finding("shared memory", "ok", detail)
    if free is None:
        return Finding(SHM, "note",
                       f"not present; the loader needs {_gib(need)} of shared memory for this plan")
    detail = f"{_gib(free)} free; the loader needs up to {_gib(need)} ({batches})"
    if need > free:
        return Finding(SHM, "problem", detail + ": workers will die with a bus error (SIGBUS)",
                       fix=f"give /dev/shm at least {_gib(need * 1.25)} (that need and a quarter more, for "
                           "the other processes that use it): docker run --shm-size="
                           f"{max(1, -(-need * 5 // 4 // 2**30))}g …; Kubernetes: an emptyDir with "
                           "medium: Memory mounted at /dev/shm; or fewer --workers / a smaller "
                           "--batch-size")
    if need > free // 2:
        return Finding(SHM, "note", detail + ": more than half of it; other processes share it",
                       fix="docker run --shm-size=… to leave room")
    return Finding(SHM, "ok", detail)


def check_open_files(plan: LoaderPlan, soft: int, hard: int) -> Finding:
    """The soft/hard ``ulimit -n`` (``-1``: unlimited) against ``plan.workers``."""
    want = max(MIN_FILES, FILES_PER_WORKER * plan.workers)
    detail = f"soft {soft}, hard {'unlimited' if hard < 0 else hard}; at least {want} for {_workers(plan)}"
    if soft < 0 or soft >= want:
        return Finding("ulimit -n", "ok", detail)
    if 0 <= hard < want:
        fix = ("the hard limit is below it too: raise both (docker run --ulimit "
               "nofile=65536:65536; /etc/security/limits.conf or systemd LimitNOFILE=) or use "
               "fewer --workers")
    else:
        limit = want if hard < 0 else min(hard, max(want, 65536))
        fix = f"ulimit -n {limit} in the shell that starts training"
    return Finding("ulimit -n", "problem", detail + ": expect 'Too many open files'", fix=fix)


def _workers(plan: LoaderPlan) -> str:
    return f"{plan.workers} worker{'' if plan.workers == 1 else 's'}"


def check_cores(plan: LoaderPlan, cores: int) -> Finding:
    """Usable cores (CPU affinity, so containers' cpusets count) against ``plan.workers``."""
    detail = f"{cores} usable; {_workers(plan)}"
    if plan.workers > cores:
        return Finding("cores", "problem",
                       detail + ": more workers than cores only adds switching and memory",
                       fix=f"--workers {max(1, cores - 1)} (one core left for the training "
                       "process)")
    if plan.workers == cores and cores > 1:
        return Finding("cores", "note", detail + ": none left for the training process",
                       fix=f"--workers {cores - 1}")
    return Finding("cores", "ok", detail)


def check_resources(plan: LoaderPlan) -> list[Finding]:
    """:func:`check_shm`, :func:`check_open_files` and :func:`check_cores` on this machine."""
    free = shutil.disk_usage(SHM).free if os.path.isdir(SHM) else None
    findings = [check_shm(plan, free, memfd=memfd_available(), available=available_memory())]
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        findings.append(check_open_files(plan, soft, hard))
    except ImportError:  # not on this platform (Windows)
        findings.append(Finding("ulimit -n", "note", "cannot be read on this platform"))
    findings.append(check_cores(plan, usable_cores()))
    return findings
