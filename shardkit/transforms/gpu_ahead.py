"""Compile a Triton kernel ahead of its first use, in a thread.

Triton compiles a kernel at its first launch for each specialisation: about 2 s on an H200 into an
empty cache (a job's first run, or every run of a job whose home directory starts empty), a few
hundred milliseconds to load it from the cache after. The GPU routes start that compile in a
thread once their workers run (:meth:`~shardkit.loader.routes.base.Route.workers_started`), so it
overlaps the workers' first batch; the first real launch waits for it (:func:`wait`) rather than
compiling the same kernel a second time beside it.

A compile that fails is logged at DEBUG only: the first real launch compiles again and raises
where the caller sees it. A process never forks while a compile runs: opening the workers' source
(:func:`~shardkit.loader.run.stream.raise_failures`, where a DataLoader forks them) calls
:func:`wait_all` first, and the interpreter's exit waits for it too (up to
:data:`EXIT_WAIT_S`; a daemon thread still inside the compiler's C++ code when the interpreter
goes can end the process in "terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Hashable

__all__ = ["EXIT_WAIT_S", "ahead", "wait", "wait_all"]

log = logging.getLogger(__name__)

#: How long the interpreter's exit waits for a compile still running.
EXIT_WAIT_S = 30.0

_lock = threading.Lock()
_compiles: dict[Hashable, threading.Thread] = {}


def ahead(key: Hashable, compile: Callable[[], None]) -> bool:
    """Run ``compile()`` in a daemon thread, once per ``key`` in this process; False if it was
    started before. Call it where no process will be forked while it runs (a child would hold a
    copy of a compiler stopped mid-way).

    Example:
        >>> ahead(("doc", 1), lambda: None), ahead(("doc", 1), lambda: None)
        (True, False)
    """
    with _lock:
        if key in _compiles:
            return False
        thread = threading.Thread(target=_run, args=(compile,), daemon=True, name="shardkit-compile")
        try:
            thread.start()
        except RuntimeError as err:  # no thread to be had: the first launch compiles, as without this module
            log.debug("shardkit: no thread to compile a kernel ahead: %s", err)
            return False
        _compiles[key] = thread
    return True


def wait(key: Hashable, timeout: float | None = None) -> None:
    """Wait for the compile started for ``key``, if any (at once when it is done, or when called
    from that compile's own thread)."""
    if not _compiles:
        return
    thread = _compiles.get(key)
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


def wait_all(timeout: float | None = None) -> None:
    """Wait for every compile still running (before a fork, and at exit); ``timeout`` for each."""
    with _lock:
        threads = list(_compiles.values())
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout)


def _run(compile: Callable[[], None]) -> None:
    try:
        compile()
    except Exception as err:  # the first real launch compiles again and raises where the user sees it
        log.debug("shardkit: compiling a kernel ahead failed: %s", err)


atexit.register(wait_all, EXIT_WAIT_S)
