"""The worker processes behind a :class:`~shardkit.loader.ShardLoader`: start and stop them."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardkit._compat import persistent_iterator, stop_persistent_workers
from shardkit.errors import LoaderError
from shardkit.loader.run.deaths import DeathSafeContext, WatchedLoader, guard_sigchld, worker_death
from shardkit.loader.run.stream import BatchStream, ship_from_this_worker
from shardkit.loader.threads import name_this_thread

__all__ = ["rank_and_world", "shutdown_workers", "worker_death", "worker_loader", "workers_running"]

log = logging.getLogger("shardkit.loader")


def _init_worker(worker_id: int) -> None:
    # Ctrl-C in a terminal signals the whole process group: the training process gets its
    # KeyboardInterrupt, and the workers carry on, so a loop that catches it (to save a
    # checkpoint, to run another epoch) still has them; they stop with the loader or its process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started (WatchedLoader)
    torch.set_num_threads(1)  # one core per worker; decode and resize are single-threaded anyway
    name_this_thread(f"sk-worker{worker_id}")  # what top and ps show for it (not its parent's name)
    ship_from_this_worker()


def _launcher_rank_and_world(*, settled: bool = True) -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` set by torchrun (or another launcher) for this process, else None.
    Where the launcher sets ``LOCAL_RANK`` but no ``RANK`` (Lightning's processes on one node),
    ``LOCAL_RANK`` is the rank on node 0 (``NODE_RANK`` unset or 0).

    ``settled=False`` (a layout taken for now): a ``WORLD_SIZE`` above 1 with neither rank
    variable gives None, for a process group made before the first iteration to say the rank.

    Raises:
        LoaderError: the variables are set but malformed, or give no rank off node 0; settled,
            a ``WORLD_SIZE`` above 1 with neither ``RANK`` nor ``LOCAL_RANK``.
    """
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is None:
        return None
    if rank is None:
        local, node = os.environ.get("LOCAL_RANK"), os.environ.get("NODE_RANK", "0")
        if local is not None and node.strip() not in ("", "0"):
            raise LoaderError(f"the launcher set WORLD_SIZE={world}, LOCAL_RANK={local} and NODE_RANK={node} but no "
                              f"RANK: pass rank= and world_size= to ShardLoader")
        rank = local
    try:
        found = int(rank if rank is not None else "0"), int(world)
    except ValueError:
        raise LoaderError(f"RANK={rank!r} and WORLD_SIZE={world!r} from the launcher are not integers") from None
    if rank is None and found[1] < 1:
        raise LoaderError(f"the launcher's WORLD_SIZE={found[1]} is no number of processes: it must be at least 1")
    if found[1] < 1 or not 0 <= found[0] < found[1]:
        names = "RANK" if os.environ.get("RANK") is not None else "LOCAL_RANK"
        raise LoaderError(f"the launcher's {names}={found[0]} and WORLD_SIZE={found[1]} are no rank of a world: "
                          f"WORLD_SIZE must be at least 1 and {names} in [0, WORLD_SIZE)")
    if rank is None and found[1] > 1:  # neither RANK nor LOCAL_RANK: rank 0 would be a guess
        if not settled:
            return None
        raise LoaderError(f"WORLD_SIZE={world} is set but neither RANK nor LOCAL_RANK: pass rank= and world_size= "
                          "to ShardLoader (or unset WORLD_SIZE)")
    return found


def rank_and_world(rank: int | None, world_size: int | None, *, settled: bool = True) -> tuple[int, int]:
    """The given ``rank``/``world_size``; each None one from the initialised ``torch.distributed``
    group, else from the launcher's ``RANK``/``WORLD_SIZE`` (torchrun sets them before the
    training script initialises its process group), else 0 and 1.

    Without the launcher's variables a loader made before ``init_process_group`` under torchrun
    would read all data on every rank; with them each rank reads its share (logged once).
    ``settled=False``: a layout taken for now (a loader's constructor; its first iteration takes
    the live one), where ``world_size > 1`` without ``rank`` may wait for a process group.

    Raises:
        LoaderError: not ``0 <= rank < world_size``, or malformed launcher variables; settled,
            ``world_size > 1`` given without ``rank`` where neither a process group nor the
            launcher says this process's rank.
    """
    detected: tuple[int, int] | None = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        detected = torch.distributed.get_rank(), torch.distributed.get_world_size()
    elif rank is None or world_size is None:
        detected = _launcher_rank_and_world(settled=settled)
        if detected is not None and detected[1] > 1:
            log.info("shardkit: no torch.distributed process group yet; rank %d of %d from the launcher's "
                     "RANK/WORLD_SIZE", *detected)
    if settled and detected is None and rank is None and world_size is not None and world_size > 1:
        raise LoaderError(f"world_size={world_size} without rank=, and neither a torch.distributed process group nor "
                          "the launcher's RANK says which rank this process is: pass rank= too (or rank=0, "
                          "world_size=1 for all the data)")
    detected = detected or (0, 1)
    rank = detected[0] if rank is None else rank
    world_size = detected[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise LoaderError(f"rank must be in [0, world_size) and world_size >= 1, got rank={rank}, "
                          f"world_size={world_size}")
    return rank, world_size


def worker_loader(stream: BatchStream, *, num_workers: int, prefetch: int, pin_memory: bool,
                  context: str | None = None) -> DataLoader[Any]:
    """A DataLoader running ``stream`` in ``num_workers`` persistent worker processes, whose
    worker deaths surface as :class:`LoaderError` wherever they happen (:mod:`shardkit.loader.run.deaths`).
    ``context``: the multiprocessing start method (None: the process's default); its ``done``
    event has no lock a killed worker could hold (:class:`~shardkit.loader.run.deaths.DeathSafeContext`).
    The workers' base seed comes from a generator of the DataLoader's own, seeded from the
    stream's seed: a DataLoader draws it from torch's global generator otherwise, which moved the
    training loop's random numbers by one draw as the workers started."""
    guard_sigchld()
    generator = torch.Generator().manual_seed(stream.config.seed % (1 << 63))
    return WatchedLoader(stream, batch_size=None, num_workers=num_workers, persistent_workers=True,
                          prefetch_factor=prefetch, pin_memory=pin_memory, worker_init_fn=_init_worker,
                          multiprocessing_context=DeathSafeContext(context) if num_workers > 0 else context,
                          generator=generator)


def shutdown_workers(loader: DataLoader[Any]) -> None:
    """Stop ``loader``'s persistent workers now (a later ``iter(loader)`` starts new ones).

    torch stops a persistent iterator's processes only when it is garbage collected
    (:func:`shardkit._compat.stop_persistent_workers`).
    """
    stop_persistent_workers(loader)


def workers_running(loader: DataLoader[Any]) -> bool:
    """Whether ``loader``'s persistent worker processes are running (an iterator holds them)."""
    return persistent_iterator(loader) is not None
