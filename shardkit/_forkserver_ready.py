"""Imported last by the feeders' forkserver: says that the server has imported its preload.

Standard library only, and imported by nothing else in shardkit, so that importing it is the last
thing the server does before it serves (:mod:`shardkit.loader.feed.ready` has the protocol).
It creates the file named by ``SHARDKIT_FORKSERVER_READY`` only in the server whose parent is
the process that named it (the pid is part of the name): not in a process that merely inherited
the variable, and not after that process has gone (no file is left behind then).
"""

from __future__ import annotations

import contextlib
import os

_path = os.environ.pop("SHARDKIT_FORKSERVER_READY", None)
if _path and os.path.basename(_path).split("-")[2:3] == [str(os.getppid())]:
    with contextlib.suppress(OSError), open(_path, "x"):
        pass
