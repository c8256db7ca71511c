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
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any, TypeVar

__all__ = ["GRACE_S", "RunLost", "in_fresh_process"]

T = TypeVar("T")

#: Seconds a stopped run has to unwind (its loader closing its processes) before it is killed.
GRACE_S = 10.0


def in_fresh_process(work: Callable[..., T], *args: object, what: str = "the run",
                     answered: Callable[[T], object] | None = None) -> T:
    """``work(*args)`` in a newly spawned process that exits when it returns; its result (or its
    exception, with the run's traceback as its ``__cause__``) comes back pickled. ``work`` must be
    importable by name (a module-level function). An interruption of the caller
    (``KeyboardInterrupt`` or any other ``BaseException`` while it waits) stops the process, then
    propagates; a second one while the process unwinds kills it at once. ``answered(result)``, where
    given, is called as soon as the result is in, before the process has ended (its end can take
    seconds: a CUDA context, compile workers), so that an interruption meanwhile loses no result.

    Raises:
        RunLost: the process died or was stopped without an answer (killed, out of memory, a
            signal, a crash in native code), naming ``what`` and how it ended.
    """
    context = multiprocessing.get_context("spawn")
    answers, answer = context.Pipe(duplex=False)
    lifeline, held = context.Pipe(duplex=False)  # ``held`` stays open here for as long as this process lives
    sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    process = context.Process(target=_serve, args=(answer, lifeline, work, args, sigint_ignored),
                              name="shardkit-bench-run")
    try:
        try:
            resource_tracker.ensure_running()  # started now, as it unblocks SIGINT while it starts
            with _sigint_held():  # inherited: a Ctrl-C while the run imports torch is no traceback there
                process.start()
        finally:
            answer.close()
            lifeline.close()
        reply = _wait_for(process, answers)
    except BaseException:
        if process.pid is not None:
            _stop(process)
        raise
    finally:
        answers.close()
        held.close()
    if reply is not None and reply[0] and answered is not None:
        answered(reply[1])
    process.join(GRACE_S)  # it has answered (or died): it ends on its own, its lifeline closed
    if process.is_alive():
        process.kill()
        process.join()
    if reply is None:
        raise RunLost(f"{what} died in its process without an answer ({_death(process.exitcode)})")
    ok, value, remote = reply
    if ok:
        return value
    if isinstance(value, _Stopped):
        raise RunLost(f"{what} was stopped in its process by {value.args[0]}") from None
    if remote:
        value.__cause__ = _RemoteTraceback(remote)
    raise value


class RunLost(RuntimeError):
    """A run's process ended without its answer: killed (out of memory, say), stopped by a signal
    sent to it alone, or crashed in native code; the message says which run and how. ``report``:
    where a training bench raised it, the report of the runs it had finished (or None)."""

    report: dict[str, Any] | None = None


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT held (blocked) meanwhile, in the main thread, and so in a process started here, which
    inherits the mask: a Ctrl-C meanwhile is not lost (ignoring it would drop it), it is raised here
    once the block ends, and the run takes its own copy where it holds SIGINT anyway
    (:func:`_arm`). Elsewhere than in the main thread, where a handler that is not Python's is
    installed, or where SIGINT is ignored (inherited as such), nothing changes."""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or before in (None, signal.SIG_IGN):
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the mask as it is, to restore
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class _Stopped(Exception):
    """The answer of a run stopped by a signal (its name in ``args[0]``)."""


class _RemoteTraceback(Exception):
    """The traceback of a run's exception, as its process printed it (the ``__cause__`` of the
    exception raised here, as :mod:`concurrent.futures` attaches it)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text}\"\"\""


def _wait_for(process: multiprocessing.process.BaseProcess, answers: Connection
              ) -> tuple[bool, Any, str | None] | None:
    """The process's answer, or None once it died without one."""
    while True:
        ready = wait([answers, process.sentinel])
        if answers in ready or answers.poll():
            try:
                return answers.recv()
            except EOFError:  # closed without an answer: it is dying
                return None
            except Exception as err:  # checked by a round trip in the run: should not happen
                return False, RuntimeError(f"the run's answer could not be read ({type(err).__name__}: {err})"), None
        if process.sentinel in ready:
            return None


def _stop(process: multiprocessing.process.BaseProcess) -> None:
    """SIGTERM, :data:`GRACE_S` to unwind, then SIGKILL (at once when another interruption cuts
    the wait short)."""
    try:
        if process.is_alive():
            process.terminate()
            process.join(GRACE_S)
    finally:
        if process.is_alive():
            process.kill()
        process.join()


def _death(exitcode: int | None) -> str:
    """How the process ended, in words."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"killed by {name}" + (": out of memory?" if exitcode == -signal.SIGKILL else "")
    return f"it exited with code {exitcode}"


#: The signals that stopped the run's process, by name (the first one raised KeyboardInterrupt in
#: its main thread).
_stopped_by: list[str] = []
#: A SIGINT taken by the thread that waits for it, passed on to the main thread as SIGTERM.
_via: list[str] = []
#: Whether the KeyboardInterrupt raised for the stop is still to be raised (again): a
#: KeyboardInterrupt raised in a ``__del__`` (a DataLoader iterator's, say) is dropped by Python,
#: and the run would go on; it is then raised anew. Other signals meanwhile are ignored, so that
#: the SIGTERM that follows a Ctrl-C does not cut short the unwinding the first one started.
_owed: list[bool] = []
#: Set once the interruption has unwound the run, or the run has its answer: a signal then finds
#: nothing to stop.
_done = threading.Event()


def _serve(answer: Connection, lifeline: Connection, work: Callable[..., Any], args: tuple[Any, ...],
           sigint_ignored: bool) -> None:
    """The run's process: ``work(*args)``, its result or exception sent back on ``answer``.
    ``sigint_ignored``: the bench ignored SIGINT (the run then does too)."""
    reply: tuple[bool, Any, str | None]
    try:
        _arm(lifeline, sigint_ignored)
        reply = (True, work(*args), None)
    except KeyboardInterrupt:
        reply = (False, _Stopped(_stopped_by[0] if _stopped_by else "SIGINT"), None)
    except Exception as err:
        # once stopped, an error raised on the way out (a DataLoader's worker stopped meanwhile) is the stop
        reply = ((False, _Stopped(_stopped_by[0]), None) if _stopped_by
                 else (False, err, traceback.format_exc()))
    finally:
        _done.set()
    with contextlib.suppress(BrokenPipeError):  # the bench is gone (or stopped this run): nobody reads
        answer.send(_sendable(reply))


def _sendable(reply: tuple[bool, Any, str | None]) -> tuple[bool, Any, str | None]:
    """``reply`` if it survives pickling both ways (an exception whose ``__init__`` takes other
    arguments than it keeps pickles and then fails to unpickle), else a RuntimeError saying what."""
    ok, value, remote = reply
    try:
        pickle.loads(pickle.dumps(value))
        return reply
    except Exception as err:
        what = "result" if ok else f"error ({type(value).__name__}: {value})"
        return False, RuntimeError(f"the run's {what:.300} cannot be sent back ({type(err).__name__}: {err})"), remote


def _arm(lifeline: Connection, sigint_ignored: bool) -> None:
    """Stop the run on its first SIGTERM or SIGINT (unless the bench ignored SIGINT, as a job
    started in the background does), and when the bench's end of ``lifeline`` closes.

    The run starts with SIGINT held (from the bench), then holds it in the threads
    and the processes it starts from here on (a DataLoader's workers): a terminal's Ctrl-C
    reaches the whole process group, and those would print tracebacks from wherever it caught
    them, mid-import or mid-batch. One thread takes SIGINT (``sigwait``) and stops the run as
    SIGTERM does; the run stops its processes as it unwinds.

    A signal may be delivered to any thread, and Python runs its handler in the main thread only
    once that thread is between two bytecodes: a main thread blocked in a call (a sleep, a pipe)
    would not see it. A SIGTERM or SIGINT therefore also wakes a thread that wakes the main
    thread with :data:`_WAKE`: its blocked call returns (EINTR) and the handler raises. A
    KeyboardInterrupt that a ``__del__`` dropped (Python prints and forgets those) is raised
    anew, not printed. Processes forked from the run (a DataLoader's workers) get none of this."""
    main = threading.main_thread().ident
    assert main is not None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, _interrupt)
    hook = sys.unraisablehook

    def unraisable(info: Any) -> None:
        if _stopped_by and not _done.is_set() and isinstance(info.exc_value, KeyboardInterrupt):
            _owed.append(True)
            signal.pthread_kill(main, signal.SIGTERM)  # the handler raises it again, where it can land
            return
        hook(info)

    # A forked process (a DataLoader's worker) starts with SIGTERM held until it has its own
    # handlers back: one taken before would run this process's handler there.
    def before_fork() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def in_parent() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def in_forked_child() -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(_WAKE, signal.SIG_DFL)
        if not sigint_ignored:  # held all the same (the mask is inherited); ignored, it stays so
            signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = hook
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    sys.unraisablehook = unraisable
    os.register_at_fork(before=before_fork, after_in_parent=in_parent, after_in_child=in_forked_child)
    stops = {int(signal.SIGTERM), int(signal.SIGINT)}
    signal.signal(_WAKE, lambda signum, frame: None)  # its only effect: the main thread's blocked call returns

    def forward() -> None:
        # Every signal with a Python handler writes here, SIGCHLD too, and so may a process forked
        # from the run before it resets its handlers (the pipe is inherited): the main thread is
        # only woken, and its handlers run for the signals this process took, none other.
        while data := os.read(wake_r, 64):
            if not _done.is_set() and stops & set(data):
                signal.pthread_kill(main, _WAKE)

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        if not _done.is_set():
            signal.pthread_kill(main, signal.SIGTERM)
        threading.Event().wait(GRACE_S)
        os._exit(1)

    def take_sigint() -> None:  # SIGINT stays held in every thread (and process) the run starts
        while True:
            signal.sigwait({signal.SIGINT})
            if not _done.is_set():
                _via.append("SIGINT")
                signal.pthread_kill(main, signal.SIGTERM)

    if not sigint_ignored:  # held first: the threads started here and after inherit it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, _interrupt)  # for a thread started before (by an import) that takes it
        threading.Thread(target=take_sigint, name="shardkit-sigint", daemon=True).start()
    threading.Thread(target=forward, name="shardkit-signals", daemon=True).start()
    threading.Thread(target=watch, name="shardkit-lifeline", daemon=True).start()


#: The signal that wakes the run's main thread from a blocked call (a no-op handler).
_WAKE = signal.SIGUSR2


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGINT in the run's process: raise KeyboardInterrupt in its main thread, once
    (again only where a ``__del__`` dropped it)."""
    if _done.is_set() or (_stopped_by and not _owed):
        return
    if _owed:
        _owed.clear()
    else:
        _stopped_by.append(_via.pop() if _via else signal.Signals(signum).name)
    raise KeyboardInterrupt
