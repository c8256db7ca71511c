"""Whether the feeders' forkserver is ready to fork feeders, asked without waiting.

The forkserver (:func:`~shardkit._compat.preloading_forkserver`) imports torch and shardkit
before it answers its first request, seconds on a busy host; a feeder launched before that
waits for the imports, in the training thread. So the server is started with
``shardkit._forkserver_ready`` last in its preload list and :data:`READY_ENV` naming a file
that does not exist yet (``shardkit-forkserver-<pid>-<random>``):
importing that module in the server creates the file, and :func:`ready` looks for it (one
``stat``). The module imports nothing of shardkit, so the file appears only once everything
before it is imported; it is written only by a server whose parent is this process, and the
server drops the variable, so no feeder inherits it.

The file lives in a directory made for it and removed at exit, so a server that finishes its
imports after this process has begun to exit has nowhere to write.

A server the program started itself, or the spawn context where there is no forkserver, is
ready at once (what a launch then costs is not known here). A server that dies is started again
by multiprocessing at the next launch, with the same preload but without the variable: no file
then, and a launch before :data:`~shardkit.loader.feed.pool.READY_WAIT_S` has passed waits for its
imports as it would without this module.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from shardkit._compat import preloading_forkserver

__all__ = ["MARK_MODULE", "READY_ENV", "forkserver", "ready"]

#: The environment variable naming the file the server creates once it has imported its preload.
READY_ENV = "SHARDKIT_FORKSERVER_READY"
#: The module the server imports last, which creates the file.
MARK_MODULE = "shardkit._forkserver_ready"

_marker: str | None = None  # in the training process: the file a server started here creates
_lock = threading.Lock()  # one start at a time: the variable is set in this process's environment


def forkserver(preload: Sequence[str]) -> Any | None:
    """The forkserver context with ``preload`` (then :data:`MARK_MODULE`) imported in its server,
    started now in the background if it is not running; None where the platform has none."""
    global _marker
    with _lock:
        folder = tempfile.mkdtemp(prefix="shardkit-")
        path = os.path.join(folder, f"shardkit-forkserver-{os.getpid()}-{os.urandom(6).hex()}")
        got = None
        try:
            got = preloading_forkserver((*preload, MARK_MODULE), env={READY_ENV: path})
        finally:
            if got is None or not got[1]:
                _forget(path)  # no server of this call will write there
        if got is None:
            return None
        ctx, started = got
        if started:
            _marker = path
            atexit.register(_forget, path)
        return ctx


def ready() -> bool:
    """Whether a feeder launched now is forked at once (the server has imported its preload)."""
    global _marker
    marker = _marker
    if marker is None:
        return True
    if not os.path.exists(marker):
        return False
    _forget(marker)
    _marker = None
    return True


def _forget(path: str) -> None:
    """Remove the marker file and its directory (whichever exist)."""
    with contextlib.suppress(OSError):
        os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))
