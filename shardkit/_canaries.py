"""A canary for each private internal :mod:`shardkit._compat` relies on: ``tests/test_compat.py``
(run by ``make test``) calls :func:`broken_internals`, so a torch, Python or library release that
removes one fails loudly, naming the internal and what to change, instead of silently degrading.

torch is imported inside the probes: importing this module imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from shardkit._compat import (
    dataloader_workers,
    pool_processes,
    pool_queues,
    stop_persistent_workers,
    torchvision_image_ops,
    unlink_queue_semaphores,
)

__all__ = ["CANARIES", "Canary", "broken_internals"]


@dataclass(frozen=True)
class Canary:
    """One internal: ``present()`` says whether this torch/Python still has it; ``fix``: what to do
    when it is gone."""

    name: str
    present: Callable[[], bool]
    fix: str


def _has(module: str, *path: str) -> Callable[[], bool]:
    def check() -> bool:
        import importlib

        try:
            obj: Any = importlib.import_module(module)
        except ImportError:
            return False
        for part in path:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True

    return check


def _dataloader_iterator_has_workers() -> bool:
    from torch.utils.data import DataLoader

    loader: DataLoader[int] = DataLoader(range(2), num_workers=1, persistent_workers=True)  # type: ignore[arg-type]
    try:
        it = iter(loader)
        workers = dataloader_workers(loader)
        return len(workers) == 1 and workers[0].pid is not None and list(it) is not None
    finally:
        stop_persistent_workers(loader)


def _dataloader_done_event_from_context() -> bool:
    """torch makes its workers' ``done`` event with the DataLoader's multiprocessing context (the
    loader's own, :class:`~shardkit.loader.run.deaths.DeathSafeContext`, counted here)."""
    from torch.utils.data import DataLoader

    from shardkit.loader.run.deaths import DeathSafeContext, FlagEvent

    made = []

    class Counting(DeathSafeContext):
        def Event(self) -> Any:  # noqa: N802 (multiprocessing's name)
            event = super().Event()
            made.append(event)
            return event

    loader: DataLoader[int] = DataLoader(range(2), num_workers=1, multiprocessing_context=Counting())  # type: ignore[arg-type]
    return len(list(loader)) == 2 and len(made) == 1 and isinstance(made[0], FlagEvent)


def _pool_has_processes() -> bool:
    with ProcessPoolExecutor(max_workers=1) as pool:
        pool.submit(int).result()
        return isinstance(getattr(pool, "_processes", None), dict) and bool(pool_processes(pool))


def _queue_semaphores_unlink() -> bool:
    """A spawn-context queue made by a pool: its names go, it still carries a message."""
    import multiprocessing
    import os

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        pool.submit(int).result()
        queues = pool_queues(pool)
        if len(queues) != 2:
            return False
        names = [q._rlock._semlock.name for q in queues]
        unlinked = sum(unlink_queue_semaphores(q) for q in queues)
        gone = not any(os.path.exists(f"/dev/shm/sem.{n.lstrip('/')}") for n in names)
        return unlinked == 5 and gone and pool.submit(int, "7").result() == 7


def _forkserver_has_state() -> bool:
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    return hasattr(server, "_forkserver_pid") and isinstance(getattr(server, "_preload_modules", None), list)


def _torchvision_image_ops_load() -> bool:
    import torch

    return torchvision_image_ops() and hasattr(torch.ops.image, "decode_jpeg")


def _accelerate_has_dataloader_tracking() -> bool:
    try:
        from accelerate.state import GradientState
    except ImportError:
        return True  # accelerate is optional: nothing to track without it
    return all(hasattr(GradientState, name) for name in ("_shared_state", "_add_dataloader", "_remove_dataloader",
                                                          "end_of_dataloader", "remainder"))


def _ray_has_bootstrap_lookup() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return True  # Ray is optional: nothing to look up without it
    return _has("ray._private.services", "canonicalize_bootstrap_address")()


CANARIES: tuple[Canary, ...] = (
    Canary("torch DataLoader _iterator._workers", _dataloader_iterator_has_workers,
           "shardkit.loader.run.deaths names a dead worker from these process objects; find where torch keeps "
           "the worker processes of a multi-process iterator and change _compat.dataloader_workers"),
    Canary("torch iterator _shutdown_workers", _has("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter",
                                                   "_shutdown_workers"),
           "loaders stop their persistent workers at close and between epochs with it; change "
           "_compat.stop_persistent_workers (without it workers live until garbage collection)"),
    Canary("torch _BaseDataLoaderIter.__next__", _has("torch.utils.data.dataloader", "_BaseDataLoaderIter", "__next__"),
           "the SIGCHLD guard (shardkit.loader.run.deaths) recognises 'inside an iteration' by this code object; "
           "point _compat.dataloader_next_code at the iterator's new __next__"),
    Canary("torch DataLoader done event from multiprocessing_context.Event()", _dataloader_done_event_from_context,
           "loaders give torch an event without a lock (shardkit.loader.run.deaths.DeathSafeContext), since a worker "
           "killed in is_set() holds a multiprocessing.Event's lock for good and the next set() hangs; find how torch "
           "now makes its workers' done event and hand it a FlagEvent there"),
    Canary("torch signal_handling._set_SIGCHLD_handler",
           _has("torch.utils.data._utils.signal_handling", "_set_SIGCHLD_handler"),
           "the SIGCHLD guard wraps torch's handler; find torch's new installer and change "
           "_compat.install_torch_sigchld_handler (without it worker deaths surface up to 5 s late)"),
    Canary("torch collate with a collate_fn_map",
           lambda: all(_has("torch.utils.data._utils.collate", name)()
                       for name in ("collate", "collate_tensor_fn", "default_collate_fn_map")),
           "the CPU route joins a transform's outputs as default_collate does, its tensors stacked in private memory "
           "(_compat.collate_joining_tensors_with); find torch's new extension point or call default_collate"),
    Canary("torch UntypedStorage._new_using_fd_cpu", _has("torch", "UntypedStorage", "_new_using_fd_cpu"),
           "the routes' worker segments (routes.segments) are nameless shared memory made with it; use torch's new "
           "fd allocator in _compat.fd_storage, or share_memory_() under the file_descriptor strategy"),
    Canary("torch UntypedStorage._share_fd_cpu_", _has("torch", "UntypedStorage", "_share_fd_cpu_"),
           "the CPU route's shared batch pool sends segments by descriptor; change _compat.fd_storage_descriptor"),
    Canary("torch UntypedStorage._new_shared_fd_cpu", _has("torch", "UntypedStorage", "_new_shared_fd_cpu"),
           "the CPU route's shared batch pool maps received segments with it; change _compat.fd_storage_attach"),
    Canary("torch._utils._flatten_dense_tensors", _has("torch._utils", "_flatten_dense_tensors"),
           "the GPU route lays images end to end with it; use torch.cat([t.reshape(-1) for t in ...]) in "
           "_compat.flatten_dense (slower: a Python call per image)"),
    Canary("torchvision image library file (image_stable / image)", _torchvision_image_ops_load,
           "the CPU decoder loads torchvision's decode_jpeg without importing torchvision (shardkit.codec.backend); "
           "find the library's new name in torchvision/io/image.py and change _compat.torchvision_image_ops "
           "(without it each decoding process imports torchvision, about 2 s of CPU)"),
    Canary("weakref.finalize._registry", _has("weakref", "finalize", "_registry"),
           "forked processes keep the parent's async filesystems alive through it (shardkit.storage._remote); "
           "without it they may print 'Unclosed client session' at exit: find the new registry"),
    Canary("multiprocessing Queue._after_fork", _has("multiprocessing.queues", "Queue", "_after_fork"),
           "feeders' log relays reset their queue in forked workers with it (shardkit.loader.feed.logs); "
           "without it a worker's records may be lost"),
    Canary("multiprocessing forkserver._forkserver", _forkserver_has_state,
           "feeders start from a forkserver that imported torch once (shardkit.loader.feed.pool); find where "
           "multiprocessing keeps its server's pid and preload list and change _compat.preloading_forkserver"),
    Canary("ProcessPoolExecutor._processes", _pool_has_processes,
           "pack stops its workers at once on Ctrl-C through it (shardkit.pack.pool); find where the executor "
           "keeps its processes and change _compat.pool_processes"),
    Canary("multiprocessing queue semaphores (_semlock.name, SemLock._cleanup, util._finalizer_registry)",
           _queue_semaphores_unlink,
           "pack unlinks its pool's semaphore names once every worker has opened them, so a kill -9 of the whole "
           "group leaves none in /dev/shm (shardkit.pack.pool); change _compat.unlink_queue_semaphores and "
           "_compat.pool_queues (without them such a kill leaves 8 sem.mp-* files)"),
    Canary("accelerate GradientState._add_dataloader", _accelerate_has_dataloader_tracking,
           "ShardLoader shows accelerate where an epoch ends (gradient accumulation steps at its last batch) "
           "through it (shardkit.loader.frameworks); find how accelerate's DataLoaderShard registers itself "
           "and change _compat.accelerate_track/accelerate_untrack"),
    Canary("ray._private.services.canonicalize_bootstrap_address", _ray_has_bootstrap_lookup,
           "ShardLoader(service=RayService('auto')) finds the node's cluster with it before connecting "
           "(shardkit.loader.service.connect); find Ray's new lookup of address='auto' and change "
           "_compat.ray_bootstrap_address"),
)


def broken_internals() -> list[str]:
    """One line per internal this torch/Python no longer has, naming it and what to change."""
    import platform

    import torch

    found = []
    for canary in CANARIES:
        try:
            ok = canary.present()
        except Exception as err:  # a canary must report, never crash the check
            ok, canary = False, Canary(f"{canary.name} ({type(err).__name__}: {err})", canary.present, canary.fix)
        if not ok:
            found.append(f"{canary.name} is gone in torch {torch.__version__} / Python "
                         f"{platform.python_version()}: {canary.fix}")
    return found
