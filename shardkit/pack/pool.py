"""Write shards in a local process pool (or in this process), reporting progress per sample.

Workers report each finished sample through a queue that the parent drains between waits, so a
progress bar moves while shards are written, not only as they complete. The counts are
advisory: when a shard completes, whatever of it was not reported yet is added at once, and
later reports for it are ignored, so each shard adds up exactly once. Workers never wait at
exit for the parent to read their reports (``cancel_join_thread``), so no shutdown can hang on
the queue.

A worker exits as soon as the parent process is gone (even after ``kill -9``, which runs no
clean-up in the parent): each watches its parent's sentinel, the pipe end that closes when the
parent dies. Without that, workers blocked on the task queue (which they hold open themselves)
lived on forever, and with them the resource tracker and the queues' semaphores in /dev/shm.

A ``kill -9`` of the whole process group kills the resource tracker too, which would otherwise
unlink the queues' named semaphores: each worker reports once it has opened them, and when all
have, the parent removes the names (the semaphores live on unnamed until the last process
holding them exits), so such a kill leaves nothing in /dev/shm either, once the last worker has
started (a kill while workers are still starting leaves the names). Ctrl-C removes them too, once
it has stopped the workers: a second Ctrl-C ends the process at once (``shardkit.cli``), before
the queues' own clean-up, and the resource tracker would otherwise warn of leaked semaphores
below "interrupted" whenever the first came before every worker was ready.

Ctrl-C: a terminal signals the whole process group. Workers start with SIGINT blocked, so only
the parent sees it; it cancels the shards not started and terminates the workers (a shard being
written leaves a temporary file, which the next pack removes before it resumes). An error
instead (a worker's, or ``on_done``'s) lets running shards finish, so a resume keeps them.

The parent waits for shards on a queue that the futures' done-callbacks fill, not with
``concurrent.futures.wait``: that takes the futures' locks one by one, and a Ctrl-C raised between
two of them left one held; the pool's manager thread, cancelling that future as the pool shut
down, then waited for it for ever, and the pack printed "interrupted" and hung at exit joining that
thread. A queue's ``get`` is interrupted with nothing held.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue as queue_module
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import BrokenExecutor, Future, InvalidStateError, ProcessPoolExecutor
from typing import Any

from shardkit._compat import pool_manager_thread, pool_processes, pool_queues, unlink_queue_semaphores
from shardkit.errors import PackError
from shardkit.pack.progress import input_bytes
from shardkit.pack.write import ShardDone, ShardReceipt, ShardTask, write_shard

SampleDone = Callable[[int, int], None]
"""Called in the parent with (samples, input bytes) just finished."""

#: How often the parent drains progress reports while it waits for shards (seconds).
POLL_S = 0.1

_reports: Any = None  # in a worker process: the queue its samples are reported to
_READY = -1  # a report's shard index that says "this worker (pid) has opened the queues"


def _exit_with_parent() -> None:
    """In a worker: exit at once when the parent process dies (a daemon thread waits for it)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch(sentinel: int) -> None:
        multiprocessing.connection.wait([sentinel])
        os._exit(1)  # the parent is gone: nobody will read what this worker writes

    threading.Thread(target=watch, args=(parent.sentinel,), name="shardkit-parent-watch",
                     daemon=True).start()


@contextlib.contextmanager
def ctrl_c_deferred(signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold back Ctrl-C (and SIGTERM, of ``signals``) meanwhile: one that arrives is raised when this ends.

    Two parts. Python raises KeyboardInterrupt in the main thread whichever thread the signal
    reached, so the handlers only record it here: an interrupt between starting a worker and
    sending it its start-up data left that worker failing on an empty pipe. And SIGINT is blocked
    in this thread, so processes started meanwhile inherit it blocked (through fork and exec):
    a terminal's Ctrl-C goes to the whole process group, and a worker interrupted inside the
    pool's queue left the pool unable to stop its workers (the pack printed "interrupted" and
    then hung at exit, joining them). The parent alone stops them.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum)) for sig in signals}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(caught):  # what arrived meanwhile, as it would have then
            previous = handlers[signal.Signals(signum)]
            if callable(previous):
                previous(signum, None)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signum)


@contextlib.contextmanager
def _cancelled_futures_quiet(manager: threading.Thread | None) -> Iterator[None]:
    """Meanwhile, an ``InvalidStateError`` that ends ``manager`` (the pool's management thread) is
    not printed. Before Python 3.12, when the pool finds its workers terminated it sets an error on
    every outstanding future, cancelled ones too, which raises there and printed a traceback over
    the terminal after "terminated; re-run the same command to resume" (CPython guards it since)."""
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if manager is None or args.thread is not manager or not issubclass(args.exc_type, InvalidStateError):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        if threading.excepthook is hook:
            threading.excepthook = previous


def _stop_workers(pool: ProcessPoolExecutor, futures: Iterable[Future[ShardReceipt]], names: _Names) -> None:
    """Stop ``pool`` at once: cancel the shards not started, terminate its workers (a shard they
    were writing leaves only a temporary file, which the next pack removes), reap them and remove
    the names of the queues' semaphores (no process opens them any more), a second Ctrl-C deferred
    meanwhile. The pool's own shutdown waits for running shards and, once interrupted, hung."""
    processes, manager, queues = pool_processes(pool), pool_manager_thread(pool), pool_queues(pool)
    with ctrl_c_deferred(), _cancelled_futures_quiet(manager):
        for future in futures:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for q in queues:  # nobody reads the tasks left in it: joining its writer could block for ever at exit
            if hasattr(q, "cancel_join_thread"):
                q.cancel_join_thread()
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        names.unlink()
        if manager is not None:  # gone before exit: CPython 3.11's exit hook woke it through a closed pipe
            manager.join(timeout=5)


def _init_worker(reports: Any, per_sample: bool) -> None:
    global _reports
    _exit_with_parent()
    reports.cancel_join_thread()  # exiting never blocks on reports nobody reads any more
    reports.put((_READY, os.getpid()))  # every queue this worker uses was opened as it started
    _reports = reports if per_sample else None


def _write_reporting(task: ShardTask) -> ShardReceipt:
    reports, index = _reports, task.plan.index
    if reports is None:
        return write_shard(task)
    return write_shard(task, on_sample=lambda nbytes: reports.put((index, nbytes)))


class _Tally:
    """Per-shard counts of reported samples, so that every shard adds up exactly once."""

    def __init__(self, on_sample: SampleDone) -> None:
        self.on_sample = on_sample
        self.counts: dict[int, tuple[int, int]] = {}
        self.finished: set[int] = set()

    def sample(self, index: int, nbytes: int) -> None:
        if index in self.finished:
            return
        samples, total = self.counts.get(index, (0, 0))
        self.counts[index] = (samples + 1, total + nbytes)
        self.on_sample(1, nbytes)

    def finish(self, task: ShardTask) -> None:
        samples, total = self.counts.pop(task.plan.index, (0, 0))
        self.finished.add(task.plan.index)
        rest = (len(task.samples) - samples, input_bytes(task.samples) - total)
        if rest != (0, 0):
            self.on_sample(*rest)


class _Names:
    """Unlinks the pool's semaphore names once every worker has reported that it opened them (or
    once Ctrl-C has stopped the workers)."""

    def __init__(self, pool: ProcessPoolExecutor, reports: Any) -> None:
        self.pool = pool
        self.queues = (*pool_queues(pool), reports)  # kept: a pool that is shut down no longer holds them
        self.workers: set[int] | None = None  # known once every task is submitted (no worker starts after)
        self.ready: set[int] = set()
        self.done = False

    def started(self) -> None:
        self.workers = {p.pid for p in pool_processes(self.pool)}

    def unlink_when_ready(self) -> None:
        if self.workers is not None and self.workers <= self.ready:
            self.unlink()

    def unlink(self) -> None:
        """Remove the names now; once: the tracker prints a traceback for a name withdrawn twice."""
        with ctrl_c_deferred():  # all or nothing: a name left half withdrawn makes the tracker warn at exit
            if self.done:
                return
            self.done = True
            for q in self.queues:
                unlink_queue_semaphores(q)


def _drain(reports: Any, tally: _Tally | None, names: _Names) -> None:
    while True:
        try:
            index, value = reports.get_nowait()
        except queue_module.Empty:
            break
        if index == _READY:
            names.ready.add(value)
        elif tally is not None:
            tally.sample(index, value)
    names.unlink_when_ready()


def _next_done(done: queue_module.SimpleQueue[Future[ShardReceipt]], reports: Any, tally: _Tally | None,
               names: _Names) -> Future[ShardReceipt]:
    """The next future to finish, draining progress reports every :data:`POLL_S` meanwhile."""
    while True:
        try:
            future: Future[ShardReceipt] | None = done.get(timeout=POLL_S)
        except queue_module.Empty:
            future = None
        _drain(reports, tally, names)
        if future is not None:
            return future


#: the exit status of a writer that reached a pack call while it imported the main module
REENTERED = 86
#: the start of a writer process's name (set before a spawned process imports the main module)
WRITER = "shardkit-pack-writer"


class _WriterProcess(multiprocessing.context.SpawnProcess):
    """A spawned writer, named :data:`WRITER`-N."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = WRITER + self.name.removeprefix(type(self).__name__)


class _WriterContext(multiprocessing.context.SpawnContext):
    """The spawn context, its processes :class:`_WriterProcess` (see :func:`exit_if_reentered`)."""

    Process = _WriterProcess


def exit_if_reentered() -> None:
    """End this process with :data:`REENTERED` if it is a pack writer importing the main module.

    Spawned processes import the script that started them; one that calls ``pack()`` at its top
    level, without ``if __name__ == "__main__":``, would pack again in every writer (and find the
    first pack's lock). :func:`run_local` turns the status into a one-line error. Other processes
    importing the script (a pool or a loader's workers of the script's own) pack nothing anew:
    they find the dataset packed.
    """
    here = multiprocessing.current_process()
    if getattr(here, "_inheriting", False) and here.name.startswith(WRITER):
        os._exit(REENTERED)  # no clean-up of a half-started process: its parent reports it


def _reentered(processes: Iterable[Any]) -> bool:
    """Whether a writer among ``processes`` ended with :data:`REENTERED` (waiting a little for each)."""
    for process in processes:
        process.join(5)
        if process.exitcode == REENTERED:
            return True
    return False


def run_local(tasks: list[ShardTask], workers: int, on_done: ShardDone | None,
              on_sample: SampleDone | None) -> list[ShardReceipt]:
    """Write ``tasks`` with ``workers`` spawned processes (in this process when 1 or one task).

    Receipts come back in completion order. ``on_done`` runs in this process as each shard
    completes and may raise to stop the pack: shards not started are cancelled, running ones
    finish (complete shards are kept for a resume); a KeyboardInterrupt stops the workers at once
    (see the module doc). ``on_sample`` gets per-sample progress.
    """
    if workers <= 1 or len(tasks) <= 1:
        receipts = []
        for task in tasks:
            report = None if on_sample is None else (lambda nbytes: on_sample(1, nbytes))
            receipts.append(write_shard(task, on_sample=report))
            if on_done is not None:
                on_done(task, receipts[-1])
        return receipts
    # spawn: workers start clean (no inherited fsspec instances, threads or locks).
    context = _WriterContext()
    tally = _Tally(on_sample) if on_sample is not None else None
    receipts = []
    futures: dict[Future[ShardReceipt], ShardTask] = {}
    processes: list[Any] = []
    with ctrl_c_deferred():  # the workers start (on submit) with Ctrl-C blocked: see ctrl_c_deferred
        # made meanwhile too: a semaphore interrupted between its tracking and its clean-up made
        # the resource tracker warn of a leak at exit
        reports = context.Queue()
        pool = ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context, initializer=_init_worker,
                                   initargs=(reports, on_sample is not None))
        names = _Names(pool, reports)
    try:
        with ctrl_c_deferred():
            for t in tasks:
                futures[pool.submit(_write_reporting, t)] = t
        names.started()
        processes = pool_processes(pool)
        done: queue_module.SimpleQueue[Future[ShardReceipt]] = queue_module.SimpleQueue()
        with ctrl_c_deferred():  # each takes the future's lock, as wait() did (see the module doc)
            for future in futures:
                future.add_done_callback(done.put)
        for _ in range(len(futures)):
            future = _next_done(done, reports, tally, names)
            receipts.append(future.result())  # re-raises a worker's error here
            task = futures[future]
            if tally is not None:
                tally.finish(task)
            if on_done is not None:
                on_done(task, receipts[-1])
    except BaseException as err:
        if isinstance(err, BrokenExecutor) and _reentered(processes):
            pool.shutdown(wait=False, cancel_futures=True)
            raise PackError("the pack call ran again in the writer processes, which import the main script as they "
                            "start: make it under `if __name__ == \"__main__\":`") from None
        if not isinstance(err, Exception):  # Ctrl-C (or exit): stop now, a resume redoes running shards
            _stop_workers(pool, futures, names)
            raise
        try:
            with ctrl_c_deferred():
                for future in futures:
                    future.cancel()  # shards not started
            pool.shutdown(wait=True)  # an error: running shards finish and are kept for a resume
        except BaseException:  # Ctrl-C while they finish
            _stop_workers(pool, futures, names)
        raise
    pool.shutdown(wait=True)
    reports.close()
    return receipts
