"""Each measured run in a Python process of its own, started for it and gone after it.

A training bench that runs every contender in one process measures each beside the leftovers of
the others: a CUDA context and its caching allocator, threads of a DALI pipeline, persistent
workers or feeder processes not yet reaped, a compiled model warmed by someone else's batches.
Users run one loader per job; a fair bench does too. A spawned process (never forked: a forked
CUDA context is unusable) starts with nothing but the interpreter and pays its own start-up
(imports, ``torch.compile``, the loader's workers) before its timed steps, as a job would.

A run never outlives the bench: when the bench is interrupted (Ctrl-C, a SIGTERM from a
scheduler or ``kill``) the run is stopped at once, not awaited, and when the bench's process
dies without a word (SIGKILL, out of memory) the run sees its lifeline close and stops itself.
A stopped run unwinds as an interrupted script does, so its loader stops its own worker and
feeder processes; one that does not end within :data:`GRACE_S` is killed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any, TypeVar

__all__ = ["GRACE_S", "in_fresh_process"]

T = TypeVar("T")

#: Seconds a stopped run has to unwind (its loader closing its processes) before it is killed.
GRACE_S = 10.0


def in_fresh_process(work: Callable[..., T], *args: object, what: str = "the run") -> T:
    """``work(*args)`` in a newly spawned process that exits when it returns; its result (or its
    exception) comes back pickled. ``work`` must be importable by name (a module-level function).
    An interruption of the caller (``KeyboardInterrupt`` or any other ``BaseException`` while it
    waits) stops the process, then propagates.

    Raises:
        RuntimeError: the process died without an answer (killed, out of memory, a crash in native
            code), naming ``what``.
    """
    context = multiprocessing.get_context("spawn")
    answers, answer = context.Pipe(duplex=False)
    lifeline, held = context.Pipe(duplex=False)  # ``held`` stays open here for as long as this process lives
    process = context.Process(target=_serve, args=(answer, lifeline, work, args), name="shardkit-bench-run")
    try:
        process.start()
    finally:
        answer.close()
        lifeline.close()
    try:
        reply = _wait_for(process, answers)
    except BaseException:
        _stop(process)
        raise
    finally:
        answers.close()
        held.close()
    process.join()
    if reply is None:
        raise RuntimeError(f"{what} died in its process without an answer ({_death(process.exitcode)})")
    ok, value = reply
    if ok:
        return value
    raise value


def _wait_for(process: multiprocessing.process.BaseProcess, answers: Connection) -> tuple[bool, Any] | None:
    """The process's answer, or None once it died without one."""
    while True:
        ready = wait([answers, process.sentinel])
        if answers in ready or answers.poll():
            try:
                return answers.recv()
            except EOFError:  # closed without an answer: it is dying
                return None
        if process.sentinel in ready:
            return None


def _stop(process: multiprocessing.process.BaseProcess) -> None:
    """SIGTERM, :data:`GRACE_S` to unwind, then SIGKILL."""
    if process.is_alive():
        process.terminate()
        process.join(GRACE_S)
    if process.is_alive():
        process.kill()
    process.join()


def _death(exitcode: int | None) -> str:
    """How the process ended, in words."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"killed by {name}" + (": out of memory?" if exitcode == -signal.SIGKILL else "")
    return f"exit code {exitcode}: a crash in native code, or os._exit"


def _serve(answer: Connection, lifeline: Connection, work: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The run's process: ``work(*args)``, its result or exception sent back on ``answer``."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    threading.Thread(target=_watch, args=(lifeline,), name="shardkit-lifeline", daemon=True).start()
    try:
        reply: tuple[bool, Any] = (True, work(*args))
    except KeyboardInterrupt:
        return  # stopped (by the bench, its death, or a Ctrl-C the bench also got): nobody waits for an answer
    except Exception as err:
        reply = (False, err)
    finally:
        _stopping.set()  # unwound: a later signal finds nothing to stop (the watcher ends the process)
    try:
        answer.send(reply)
    except BrokenPipeError:
        return  # the bench is gone
    except Exception as err:  # an unpicklable result or exception
        answer.send((False, RuntimeError(f"the run's {'result' if reply[0] else 'error'} cannot be sent back "
                                         f"({type(err).__name__}: {err}): {reply[1]!r:.200}")))


#: Set once the run's process was interrupted or has its answer: later signals are ignored, so
#: that a SIGTERM after a Ctrl-C (both reach it when a terminal's Ctrl-C stops the bench) does
#: not cut short the unwinding the first one started.
_stopping = threading.Event()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGINT in the run's process: the first raises KeyboardInterrupt in its main thread."""
    if _stopping.is_set():
        return
    _stopping.set()
    raise KeyboardInterrupt


def _watch(lifeline: Connection) -> None:
    """Stop this run when the bench's process is gone or done with it (its end of the lifeline
    closes), and end the process if it has not ended :data:`GRACE_S` later."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv()
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(GRACE_S)
    os._exit(1)
