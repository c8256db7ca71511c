"""Worker deaths: which worker of a :class:`~shardkit.loader.ShardLoader` died and how, raised
where the loader can name it.

When a worker dies, torch's SIGCHLD handler raises ``RuntimeError: DataLoader worker (pid X) is
killed by signal`` in the main thread, in whatever Python code runs when the signal lands: often
the training step between two batches, where no loader code can turn it into our error. The
handler installed here (:func:`guard_sigchld`, wrapping torch's) lets that error through only
while the main thread is inside an iteration (the delivery loop every route shares,
:meth:`~shardkit.loader.routes.base.Route.deliver`, or any DataLoader iterator's ``__next__``), where
the loader turns it into a :class:`LoaderError` naming the worker (:func:`worker_death`).
Elsewhere it records the death, and the loader raises that :class:`LoaderError` as soon as the
next batch is asked for (:class:`WatchedLoader`), instead of torch's status check finding it
up to 5 s later.

A worker killed while it holds a lock it shares with the main process would hang the main
process for good in its next acquire. The one torch's main side takes is its ``done`` event's
(a ``multiprocessing.Event``: a condition over a shared lock that every worker takes in each
``is_set()``, once per batch asked of it); torch takes it in ``_mark_worker_as_unavailable`` as it
reports the death and in ``_shutdown_workers`` as it stops the others. :class:`DeathSafeContext`
gives the DataLoader an event without a lock (:class:`FlagEvent`).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader

from shardkit._compat import (
    dataloader_next_code,
    dataloader_workers,
    install_torch_sigchld_handler,
    persistent_iterator,
    state_without_iterator,
)
from shardkit.errors import LoaderError
from shardkit.loader.routes.base import Route

__all__ = ["DEATH_GRACE_S", "DeathSafeContext", "FlagEvent", "WatchedLoader", "guard_sigchld", "worker_death"]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def worker_death(loader: DataLoader[Any]) -> LoaderError | None:
    """A :class:`LoaderError` saying which of ``loader``'s worker processes died and how, with the
    likely cause and fix, or None while they all run.

    What torch raises when a worker dies depends on timing: ``RuntimeError: DataLoader worker
    (pid X) is killed by signal: Killed.`` from its SIGCHLD handler, ``... exited unexpectedly``
    from its status check, or a bare ``ConnectionResetError``/``EOFError`` from a queue; the
    process objects (:func:`shardkit._compat.dataloader_workers`) say which worker it was
    whatever torch raised.
    """
    procs = dataloader_workers(loader)
    dead = [(i, w.pid, w.exitcode) for i, w in enumerate(procs) if w.exitcode not in (None, 0)]
    if not dead:
        return None
    worker, pid, code = dead[0]
    how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
    what = f"DataLoader worker {worker} (pid {pid}) {how}"
    if len(dead) > 1:
        what += f" (and {len(dead) - 1} more: pids {', '.join(str(d[1]) for d in dead[1:])})"
    if code == -signal.SIGKILL:
        why = ("most likely the kernel's out-of-memory killer (check `dmesg`): each worker holds "
               "prefetch batches of decoded images; use fewer workers (num_workers="
               f"{loader.num_workers} now) or a smaller prefetch (prefetch={loader.prefetch_factor} now), "
               "or a smaller batch_size")
    elif code < 0:
        why = "the worker process crashed or was stopped from outside"
    else:
        why = "the worker process exited on its own"
    return LoaderError(f"{what}: {why}")


class FlagEvent:
    """What torch's DataLoader uses of a ``multiprocessing.Event`` (``set``, ``is_set``, ``clear``,
    ``wait``) as one shared byte, with no lock a killed worker could leave held (see the module
    doc). ``wait`` polls (torch never waits on it)."""

    def __init__(self, ctx: Any) -> None:
        self._flag = ctx.RawValue(ctypes.c_bool, False)  # travels to spawned workers with their arguments

    def is_set(self) -> bool:
        return bool(self._flag.value)

    def set(self) -> None:
        self._flag.value = True

    def clear(self) -> None:
        self._flag.value = False

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._flag.value and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.005)
        return bool(self._flag.value)


class DeathSafeContext(multiprocessing.context.BaseContext):
    """The multiprocessing context ``method`` (None: the process's default, resolved when torch
    starts the workers) for a DataLoader, whose ``Event`` is a :class:`FlagEvent`: torch's
    ``done`` event, whose lock a worker killed in ``is_set()`` would hold for good."""

    def __init__(self, method: str | None = None) -> None:
        self._method = method

    def get_context(self, method: str | None = None) -> Any:
        return multiprocessing.get_context(method if method is not None else self._method)

    def Process(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (multiprocessing's name)
        return self.get_context().Process(*args, **kwargs)

    def Event(self) -> Any:  # noqa: N802 (multiprocessing's name)
        return FlagEvent(self.get_context())


#: How many worker deaths the SIGCHLD guard recorded outside an iteration (this process), and
#: torch's message for the last one (a message, not the error: its traceback's frames, the code
#: the signal interrupted, would keep the loader and its memory alive).
_deferred: list[Any] = [0, ""]
_guarded = [False]


def _iteration_codes() -> tuple[Any, ...]:
    """The code objects that mark "inside an iteration" on the main thread's stack: the routes'
    delivery loop (where a ShardLoader waits for and finishes each batch) and DataLoader's
    ``__next__`` (:func:`shardkit._compat.dataloader_next_code`)."""
    return Route.deliver.__code__, dataloader_next_code()


def _in_iteration(frame: FrameType | None) -> bool:
    codes = _iteration_codes()
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def guard_sigchld() -> None:
    """Install (once per process, from the main thread) a SIGCHLD handler around torch's that
    raises torch's worker-death error only inside an iteration and records it elsewhere.

    torch installs its handler when its first multi-worker iterator starts, and only from the
    main thread (the GPU route starts it from its prefetch thread: no handler at all then);
    this installs it now (:func:`shardkit._compat.install_torch_sigchld_handler`) and
    wraps it. torch's handler raises before calling the handler it replaced, so skipping its
    error skips nothing else.
    """
    if _guarded[0] or threading.current_thread() is not threading.main_thread():
        return
    install_torch_sigchld_handler()
    torch_handler = signal.getsignal(signal.SIGCHLD)
    if not callable(torch_handler):  # no SIGCHLD handling on this platform
        return

    def guard(signum: int, frame: FrameType | None) -> None:
        try:
            torch_handler(signum, frame)
        except RuntimeError as err:
            if _in_iteration(frame):
                raise  # the iteration turns it into a LoaderError naming the worker
            _deferred[:] = [_deferred[0] + 1, str(err)]  # raised when the next batch is asked for

    signal.signal(signal.SIGCHLD, guard)
    _guarded[0] = True


class WatchedLoader(DataLoader[Any]):
    """A DataLoader whose iterators first raise a death of one of its workers that the SIGCHLD
    guard recorded while no iteration ran: torch's error, which the loader's iteration turns
    into :func:`worker_death`'s :class:`LoaderError` as it does when the error comes from the
    handler itself."""

    _deaths_seen = 0

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a pickled or deep-copied loader) starts workers of its own when it first
        # iterates; the running ones and their iterator stay the original's
        return state_without_iterator(self)

    def _raise_deferred(self) -> None:
        if self._deaths_seen != _deferred[0]:
            self._deaths_seen = _deferred[0]
            death = worker_death(self)
            if death is not None:
                raise RuntimeError(_deferred[1]) if _deferred[1] else death

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._raise_deferred()
        if persistent_iterator(self) is not None:  # its workers run: no start to guard, and Ctrl-C
            return _Watched(super().__iter__(), self)  # must reach a wait for them at once
        # workers started now inherit SIGINT blocked (through fork and exec) until they ignore it
        # (shardkit.loader.run.workers): a terminal's Ctrl-C, sent to the whole process group, as
        # they start killed them; one meant for this process arrives when it is unblocked here
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            batches = super().__iter__()
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            if not _unpicklable(err):
                raise
            context = self.multiprocessing_context
            method = (context.get_context() if isinstance(context, DeathSafeContext) else
                      multiprocessing.get_context()).get_start_method()
            raise LoaderError(f"the worker processes start by {method!r}, which sends them the loader's transform "
                              f"and other arguments pickled, and one cannot be: {err}; define functions at a "
                              "module's top level (no lambda or local function) and keep what cannot be pickled "
                              "(locks, open files) out of them, or pass num_workers=0") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return _Watched(batches, self)

    def check_worker_number_rationality(self) -> None:
        """Say nothing: torch's warning about more workers than cores names a DataLoader the
        user never made; the loader says it in its own words when it is built
        (:func:`~shardkit.loader.arguments.worker_count`)."""


def _unpicklable(err: BaseException) -> bool:
    """Whether ``err``, raised as workers started, is pickle's refusal of something sent to them:
    a PicklingError, or an error raised while multiprocessing pickled the process (Python 3.13
    names a local object in an AttributeError without the word "pickle")."""
    if isinstance(err, pickle.PicklingError) or "pickle" in str(err):
        return True
    frames = traceback.extract_tb(err.__traceback__)
    return any(frame.filename.endswith(os.path.join("multiprocessing", "reduction.py")) for frame in frames)


#: How long a connection error from the workers' queue waits for a worker death to show.
DEATH_GRACE_S = 1.0


class _Watched:
    """A DataLoader iterator whose connection errors name the worker that died, if one did.

    A worker killed while the main process fetches what it sent (a batch's shared-memory
    descriptor, from the worker's resource-sharer socket) surfaces as ``ConnectionResetError``
    or ``EOFError``. The kernel closes a dying process's sockets before its exit status can be
    read, so :func:`worker_death` may not see the death yet: it is asked again for up to
    :data:`DEATH_GRACE_S` (10 ms apart) before the error is re-raised as it is.
    """

    def __init__(self, iterator: Iterator[Any], loader: WatchedLoader) -> None:
        self._inner, self._loader = iterator, loader

    def __iter__(self) -> _Watched:
        return self

    def __next__(self) -> Any:
        self._loader._raise_deferred()
        try:
            return next(self._inner)
        except (ConnectionError, EOFError) as err:
            deadline = time.monotonic() + DEATH_GRACE_S
            while (death := worker_death(self._loader)) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if death is None:
                raise
            raise death from err
