"""Log records of feeder processes and their workers, handled in the training process as if
logged there: by the handlers and at the levels the training script configured.

A feeder is a spawned process: it does not inherit the script's logging configuration (a file
handler, a format, ``shardkit`` at INFO), so a warning about a corrupt image decoded there would
reach only stderr, unformatted, and an INFO line not at all. :func:`relay_to` makes the feeder's
root logger put every record on a queue (its workers, forked from it, inherit that); the
:class:`LogRelay` thread in the training process hands each record to the logger of the same
name there.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import threading
from typing import Any

__all__ = ["LogRelay", "relay_to"]


class _Relayed(logging.handlers.QueueHandler):
    """A QueueHandler whose process never waits at exit to flush records nobody may read."""

    def __init__(self, queue: Any) -> None:
        super().__init__(queue)
        self._relay = queue  # a multiprocessing Queue

    def enqueue(self, record: logging.LogRecord) -> None:
        self._relay.cancel_join_thread()  # reset in each forked worker: set again before each put
        self._relay.put_nowait(record)


def relay_to(queue: Any, level: int) -> None:
    """In a feeder: send every record of ``level`` or above to ``queue`` (and nowhere else)."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(_Relayed(queue))
    root.setLevel(level)


class LogRelay:
    """The training process's end: a queue for the feeders and the thread that handles what
    arrives on it. ``level``: the ``shardkit`` logger's effective level here, which the feeders
    log at."""

    def __init__(self, ctx: Any) -> None:
        self.queue = ctx.Queue()
        self.level = logging.getLogger("shardkit").getEffectiveLevel()
        self._thread = threading.Thread(target=self._run, daemon=True, name="shardkit-feeder-logs")
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                record = self.queue.get()
            except (EOFError, OSError, ValueError):  # the queue was closed
                return
            if record is None:
                return
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)

    def close(self) -> None:
        """Handle what the feeders sent, then stop (call once they have exited)."""
        with contextlib.suppress(OSError, ValueError):
            self.queue.put(None)
        self._thread.join(timeout=5.0)
        self.queue.close()
