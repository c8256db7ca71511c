"""Every private torch, CPython, multiprocessing and Ray internal shardkit relies on, in one place.

Each is used because no public API does the job (the docstring says what it is for and since
when it has been stable); each has a canary in :data:`shardkit._canaries.CANARIES` that
``tests/test_compat.py`` (run by ``make test``) checks, so a torch or
Python release that removes one fails loudly, naming the internal and what to change, instead of
silently degrading (a worker death no longer named, a pack that cannot be stopped).

torch is imported inside the functions: ``import shardkit`` and the CLI must not import it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import weakref
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

__all__ = [
    "accelerate_gradient_state",
    "accelerate_track",
    "accelerate_untrack",
    "dataloader_next_code",
    "dataloader_workers",
    "fd_storage",
    "fd_storage_attach",
    "fd_storage_descriptor",
    "flatten_dense",
    "hidden_main",
    "preloading_forkserver",
    "ray_bootstrap_address",
    "install_torch_sigchld_handler",
    "live_finalizers",
    "pool_manager_thread",
    "persistent_iterator",
    "state_without_iterator",
    "pool_processes",
    "pool_queues",
    "reset_queue_after_fork",
    "stop_persistent_workers",
    "torchvision_image_ops",
    "unlink_queue_semaphores",
]


# --- torch.utils.data ---------------------------------------------------------------------------

def dataloader_workers(loader: DataLoader[Any]) -> list[Any]:
    """The worker process objects of ``loader``'s live iterator (``_iterator._workers``, stable since
    torch 1.7), or ``[]``: they say which worker died whatever torch raised for it."""
    return list(getattr(getattr(loader, "_iterator", None), "_workers", None) or [])


def persistent_iterator(loader: DataLoader[Any]) -> Any:
    """The iterator a ``persistent_workers`` DataLoader keeps while its workers live
    (``_iterator``, stable since torch 1.7), or None."""
    return getattr(loader, "_iterator", None)


def state_without_iterator(loader: DataLoader[Any]) -> dict[str, Any]:
    """``loader``'s ``__dict__`` for a copy, without the iterator of its running persistent workers
    (``_iterator``, stable since torch 1.7; it cannot be pickled): the copy starts its own."""
    return {**loader.__dict__, "_iterator": None}


def stop_persistent_workers(loader: DataLoader[Any]) -> None:
    """Stop a ``persistent_workers`` DataLoader's workers now and drop its iterator (torch stops them
    only when that iterator is garbage collected; ``_shutdown_workers``, stable since torch 1.7)."""
    iterator = persistent_iterator(loader)
    if iterator is None:
        return
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()
    loader._iterator = None


def shut_down_iterator(iterator: Any) -> None:
    """Stop a DataLoader iterator's worker processes now, and take them off the list torch's SIGCHLD
    handler checks (``_shutdown_workers``, stable since torch 1.7); anything else: nothing."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if callable(stop):
        stop()


def dataloader_next_code() -> types.CodeType:
    """The code object of every DataLoader iterator's ``__next__`` (``_BaseDataLoaderIter``, a
    private class stable since torch 1.0): a frame running it is inside an iteration."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter.__next__.__code__


def collate_joining_tensors_with(batch: list[Any], join: Callable[[list[torch.Tensor]], torch.Tensor]) -> Any:
    """``default_collate(batch)`` with ``join`` stacking its tensors (numpy arrays too, as tensors):
    torch's ``collate`` with a ``collate_fn_map`` (``torch.utils.data._utils.collate``, the
    extension point ``default_collate``'s docs show, since torch 2.0). ``default_collate`` itself
    stacks into a new segment of /dev/shm in a DataLoader worker."""
    import torch
    from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

    def tensors(items: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
        if items[0].is_nested or items[0].layout != torch.strided:  # torch's own refusals and layouts
            return collate_tensor_fn(items, collate_fn_map=collate_fn_map)
        return join(items)

    return collate(batch, collate_fn_map={**default_collate_fn_map, torch.Tensor: tensors})


def install_torch_sigchld_handler() -> None:
    """Install torch's SIGCHLD handler for DataLoader workers now (``_set_SIGCHLD_handler``, stable
    since torch 1.0; torch installs it only from the main thread's first multi-worker iterator)."""
    from torch.utils.data._utils import signal_handling

    signal_handling._set_SIGCHLD_handler()


# --- torch storages and tensors -----------------------------------------------------------------

def fd_storage(nbytes: int) -> torch.UntypedStorage:
    """``nbytes`` of zeroed shared memory with no name in /dev/shm (torch's file-descriptor
    allocation, ``UntypedStorage._new_using_fd_cpu``, which unlinks the segment once mapped)."""
    import torch

    return torch.UntypedStorage._new_using_fd_cpu(nbytes)


def fd_storage_descriptor(storage: torch.UntypedStorage) -> tuple[int, int]:
    """``(fd, nbytes)`` of an :func:`fd_storage` (``_share_fd_cpu_``), to send over a Unix socket."""
    fd, nbytes = storage._share_fd_cpu_()
    return fd, nbytes


def fd_storage_attach(fd: int, nbytes: int) -> torch.UntypedStorage:
    """The shared segment behind ``fd`` mapped in this process (``_new_shared_fd_cpu``); the caller
    still owns ``fd``."""
    import torch

    return torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # type: ignore[attr-defined]


def flatten_dense(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contiguous tensors laid end to end in one flat tensor in one C++ call
    (``torch._utils._flatten_dense_tensors``, what DDP's bucketing uses; ``torch.cat`` of reshapes
    costs a Python call per tensor)."""
    import torch._utils

    return torch._utils._flatten_dense_tensors(list(tensors))


# --- torchvision --------------------------------------------------------------------------------

def torchvision_image_ops() -> bool:
    """Load torchvision's image library (``torch.ops.image.decode_jpeg``, ``decode_webp``) without
    importing the ``torchvision`` package, whose ``__init__`` imports its models and ops and through
    them ``torch._dynamo``: about 2 s of CPU in every process that decodes (each spawned worker,
    each rank). The library is ``image_stable`` (torchvision 0.29 on) or ``image`` beside the
    package's ``__init__``, a layout stable since 0.8. False where neither loads: ``import
    torchvision.io`` then loads it."""
    import importlib.machinery
    import importlib.util
    import os

    import torch

    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for name in ("image_stable", "image"):
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, name + suffix)
                if os.path.isfile(path):
                    try:
                        torch.ops.load_library(path)
                    except OSError:
                        continue
                    return True
    return False


# --- CPython ------------------------------------------------------------------------------------

def live_finalizers() -> list[weakref.finalize[Any, Any]]:
    """Every live :class:`weakref.finalize` (its class registry, a CPython detail stable since 3.4;
    there is no public list), or ``[]`` where the registry is missing."""
    return list(getattr(weakref.finalize, "_registry", {}))


def reset_queue_after_fork(queue: Any) -> None:
    """Have a :class:`multiprocessing.Queue` that was unpickled here reset itself in children forked
    from now on (``Queue._after_fork``, which it registers only where it was made)."""
    import multiprocessing.util

    multiprocessing.util.register_after_fork(queue, type(queue)._after_fork)


def pool_processes(pool: ProcessPoolExecutor) -> list[Any]:
    """The worker processes of ``pool`` (``_processes``, CPython 3.8 to 3.14), to stop them at once."""
    return list((getattr(pool, "_processes", None) or {}).values())


def pool_queues(pool: ProcessPoolExecutor) -> list[Any]:
    """The call and result queues of ``pool`` (``_call_queue``, ``_result_queue``, CPython 3.8 to 3.14)."""
    return [q for q in (getattr(pool, "_call_queue", None), getattr(pool, "_result_queue", None)) if q is not None]


def unlink_queue_semaphores(queue: Any) -> int:
    """Remove the names of a spawn-context ``multiprocessing`` queue's semaphores; returns how many.

    A queue made for spawned processes holds named POSIX semaphores (``/dev/shm/sem.mp-*`` on
    Linux), so that a child can open them by name; they are unlinked when the queue is collected or
    by the resource tracker when every process is gone, and a ``kill -9`` of the whole process group
    (the tracker included) leaves them behind for good. Once every process that will ever use the
    queue has opened them, the names can go: the semaphores live on, unnamed, until the last process
    holding them exits, as a forked queue's do from the start. The queue's own clean-up
    (``SemLock._cleanup``, a ``multiprocessing.util.Finalize``) and the tracker's entry are
    withdrawn, so nothing unlinks the name twice. ``_rlock``, ``_wlock``, ``_sem``,
    ``_semlock.name`` and ``util._finalizer_registry`` are CPython details stable since 3.8. A queue
    pickled to a process started after this cannot be opened there.
    """
    import _multiprocessing
    from multiprocessing import resource_tracker, util
    from multiprocessing.synchronize import SemLock

    names = set()
    for attr in ("_rlock", "_wlock", "_sem"):
        name = getattr(getattr(getattr(queue, attr, None), "_semlock", None), "name", None)
        if name:
            names.add(name)
    if not names:
        return 0
    cleanup = getattr(SemLock, "_cleanup", None)
    for finalizer in list(getattr(util, "_finalizer_registry", {}).values()):
        args = getattr(finalizer, "_args", None)
        if cleanup is not None and getattr(finalizer, "_callback", None) is cleanup and args and args[0] in names:
            finalizer.cancel()
    for name in names:
        with contextlib.suppress(OSError):
            _multiprocessing.sem_unlink(name)
        resource_tracker.unregister(name, "semaphore")
    return len(names)


def pool_manager_thread(pool: ProcessPoolExecutor) -> Any:
    """The thread managing ``pool`` (``_executor_manager_thread``, CPython 3.9 on), or None."""
    return getattr(pool, "_executor_manager_thread", None)


@contextlib.contextmanager
def hidden_main() -> Generator[None, None, None]:
    """Replace ``sys.modules["__main__"]`` by an empty module for a moment.

    A spawned child imports the parent's ``__main__`` from its path, running every top-level
    statement of a script without an ``if __name__ == "__main__":`` guard (a training loop, in a
    process that must only feed a feeder); meanwhile it does not, and pickling an object defined
    in the script (which such a child could not load) fails, naming it."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def preloading_forkserver(preload: Sequence[str], env: dict[str, str] | None = None) -> tuple[Any, bool] | None:
    """torch.multiprocessing's ``forkserver`` context, its server started now (in the background)
    with ``preload`` imported in order, and whether this call started it; ``None`` where this
    platform has no forkserver.

    A child of the server is a fork of a process that imported torch once, so starting one costs
    milliseconds where a spawned child imports torch, torchvision and shardkit again (seconds of
    CPU each). The server starts from a fresh interpreter (no CUDA, threads or locks of this
    process) with this process's environment plus ``env`` (set in this process while the server
    starts; the resource tracker started with it inherits it too) and ``sys.path``, under
    :func:`hidden_main` (it never runs the training script). ``preload`` comes last in the server's
    list, in its order, after modules the program asked for. A server the program started itself
    is used as it is: its own preload list stays. Not thread-safe (it sets ``os.environ``): callers
    serialise their calls. Private:
    ``multiprocessing.forkserver._forkserver`` (the process-wide server, ``_forkserver_pid``,
    ``_preload_modules``; CPython 3.4 on)."""
    import multiprocessing
    from multiprocessing import forkserver

    import torch.multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    ctx = torch.multiprocessing.get_context("forkserver")
    server: Any = forkserver._forkserver
    if server._forkserver_pid is not None:
        return ctx, False
    wanted = [m for m in server._preload_modules if m not in preload] + list(preload)
    ctx.set_forkserver_preload(wanted)
    before = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with hidden_main():
            server.ensure_running()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return ctx, True


# --- accelerate (never imported here: only read when the user's script imported it) -----------

def accelerate_gradient_state() -> Any | None:
    """accelerate's ``GradientState`` when an ``Accelerator`` exists in this process, else None.

    Its shared state (``GradientState._shared_state``, accelerate 0.17 on) is empty until an
    ``Accelerator`` is made; making a ``GradientState`` before that would set it up with defaults."""
    module = sys.modules.get("accelerate.state")
    cls = getattr(module, "GradientState", None)
    if cls is None or not getattr(cls, "_shared_state", None):
        return None
    return cls()


def accelerate_processes() -> int | None:
    """The processes accelerate runs this one among (``PartialState.num_processes``) where an
    ``Accelerator`` or ``PartialState`` exists in this process, else None (its shared state, set
    up by the first one made, as :func:`accelerate_gradient_state` reads it)."""
    module = sys.modules.get("accelerate.state")
    shared = getattr(getattr(module, "PartialState", None), "_shared_state", None)
    count = shared.get("num_processes") if isinstance(shared, dict) else None
    return count if isinstance(count, int) else None


def accelerate_track(state: Any, loader: Any) -> None:
    """Make ``loader`` the active dataloader of accelerate's ``state``, as accelerate's own
    ``DataLoaderShard.begin`` does (``GradientState._add_dataloader``: no public equivalent)."""
    state._add_dataloader(loader)


def accelerate_untrack(state: Any, loader: Any) -> None:
    """Withdraw ``loader`` from ``state``, as ``DataLoaderShard.end`` does (``_remove_dataloader``)."""
    state._remove_dataloader(loader)


# --- Ray ----------------------------------------------------------------------------------------

def ray_bootstrap_address(address: str) -> str | None:
    """The ``HOST:PORT`` that Ray's ``address="auto"`` means on this node (the cluster ``ray start``
    recorded in its temp dir, or ``RAY_ADDRESS``), found without connecting
    (``ray._private.services.canonicalize_bootstrap_address``, stable since Ray 2.0): the
    service reaches it with a timeout before ``ray.init``, which would wait minutes on a stale
    record. Raises ``ConnectionError`` when no cluster is recorded."""
    from ray._private import services

    found = services.canonicalize_bootstrap_address(address)
    return None if found is None else str(found)
