"""Log records of feeder processes and their workers, handled in the training process as if
logged there: by the handlers and at the levels the training script configured.

A feeder starts from a fresh interpreter (forked from a server process, or spawned): it does
not inherit the script's logging configuration (a file handler, a format, ``shardkit`` at INFO),
so a warning about a corrupt image decoded there would reach only stderr, unformatted, and an
INFO line not at all. :func:`relay_to` makes the feeder's
root logger put every record on a queue (its workers, forked from it, inherit that); the
:class:`LogRelay` thread in the training process hands each record to the logger of the same
name there.

Best effort, never a hang: no process waits at exit to flush its records (one logged in the
last instant before a process exits may be lost), and the training process only reads the
queue, so a writer killed while holding the queue's lock cannot block it.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import queue as queue_module
import sys
import threading
from typing import Any

from shardkit._compat import reset_queue_after_fork

__all__ = ["LogRelay", "relay_to"]


class _Relayed(logging.handlers.QueueHandler):
    """A QueueHandler whose process never waits at exit to flush records nobody may read."""

    def __init__(self, queue: Any) -> None:
        super().__init__(queue)
        self._relay = queue  # a multiprocessing Queue

    def enqueue(self, record: logging.LogRecord) -> None:
        self._relay.cancel_join_thread()  # reset in each forked worker: set again before each put
        self._relay.put_nowait(record)


def relay_to(queue: Any, levels: dict[str, int]) -> None:
    """In a feeder: send every record to ``queue`` (and nowhere else), with the loggers at the
    training process's ``levels`` (logger name -> level; ``""`` the root)."""
    # An unpickled multiprocessing Queue does not reset itself in forked children (only one made
    # here does): without this, a worker forked after the feeder logged kept the feeder's queue
    # thread handle, and its records were buffered for ever (or it deadlocked on a copied lock).
    reset_queue_after_fork(queue)
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(_Relayed(queue))
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)


def _levels() -> dict[str, int]:
    """The root's level and the effective level of every ``shardkit`` logger in this process."""
    levels = {"": logging.getLogger().getEffectiveLevel(),
              "shardkit": logging.getLogger("shardkit").getEffectiveLevel()}
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("shardkit.") and isinstance(logger, logging.Logger):
            levels[name] = logger.getEffectiveLevel()
    return levels


class LogRelay:
    """The training process's end: a queue for the feeders and the thread that handles what
    arrives on it. ``levels``: this process's logger levels when the relay was made (the
    feeders log at them)."""

    def __init__(self, ctx: Any) -> None:
        self.queue = ctx.Queue()
        self.levels = _levels()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="shardkit-feeder-logs")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                record = self.queue.get(timeout=0.2)
            except queue_module.Empty:
                continue
            except (EOFError, OSError, ValueError):  # the queue was closed
                return
            self._handle(record)

    @staticmethod
    def _handle(record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        try:
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        except Exception:  # a handler of the script's that fails must not stop the relay
            with contextlib.suppress(Exception):
                print(f"shardkit: a log handler failed on a feeder's record: {record.getMessage()}", file=sys.stderr)

    def close(self) -> None:
        """Stop the relay and handle what is left on the queue (call once the feeders exited)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        for _ in range(10_000):  # what arrived after the thread's last look
            try:
                self._handle(self.queue.get_nowait())
            except (queue_module.Empty, EOFError, OSError, ValueError):
                break
        self.queue.close()
