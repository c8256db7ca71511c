"""Whether the feeders' forkserver is ready to fork feeders, asked without waiting.

The forkserver (:func:`~shardkit._compat.preloading_forkserver`) imports torch and shardkit
before it answers its first request, seconds on a busy host; a feeder launched before that
waits for the imports, in the training thread. So the server is started with this module last
in its preload list and :data:`READY_ENV` naming a file that does not exist yet: importing the
module in the server creates the file, and :func:`ready` looks for it (one ``stat``). The
variable is set for the server's start only, and the server drops it, so no feeder inherits it.

A server the program started itself, or the spawn context where there is no forkserver, is
ready at once (what a launch then costs is not known here).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from shardkit._compat import preloading_forkserver

__all__ = ["READY_ENV", "forkserver", "ready"]

#: The environment variable naming the file the server creates once it has imported its preload.
READY_ENV = "SHARDKIT_FORKSERVER_READY"

_marker: str | None = None  # in the training process: the file a server started here creates


def forkserver(preload: Sequence[str]) -> Any | None:
    """The forkserver context with ``preload`` (then this module) imported in its server, started
    now in the background if it is not running; None where the platform has none."""
    global _marker
    path = os.path.join(tempfile.gettempdir(), f"shardkit-forkserver-{os.getpid()}-{os.urandom(6).hex()}")
    got = preloading_forkserver((*preload, __name__), env={READY_ENV: path})
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
    if _marker is None:
        return True
    if not os.path.exists(_marker):
        return False
    _forget(_marker)
    _marker = None
    return True


def _forget(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _mark() -> None:
    """In the forkserver: say the preload is imported (this module is the last of it)."""
    path = os.environ.pop(READY_ENV, None)
    if path:
        with contextlib.suppress(OSError), open(path, "a"):
            pass


_mark()
