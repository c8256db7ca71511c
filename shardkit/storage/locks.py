"""Exclusive locks between processes of a node: ``fcntl.flock`` on a ``<path>.lock`` file that is
unlinked before it is released, so none is left behind once no process holds it.

The shard cache locks each shard while one process fetches it; ``pack`` locks its destination
for the whole run (see :func:`holding`), so two packs into one directory cannot interleave.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def locked(lock_path: str, *, blocking: bool = True, holder: str = "") -> Iterator[IO[str] | None]:
    """Hold an exclusive flock on ``lock_path``; yields the open lock file, or None when
    ``blocking=False`` and another process holds it. ``holder``, when given, is written into the
    file while it is held (what another process's refusal names).

    The lock file is unlinked before the lock is released, so none is left behind. Hence a
    process may lock a file that its holder has just unlinked (opened before the unlink): after
    ``flock`` it checks that the file it locked is still the one at ``lock_path`` (same device
    and inode) and otherwise starts again on the current one. Only a holder unlinks, so a lock
    whose file is the current one is exclusive.
    """
    flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
    while True:
        lock = open(lock_path, "a+")  # noqa: SIM115 (closed below, on every path)
        try:
            try:
                fcntl.flock(lock, flags)
            except BlockingIOError:
                lock.close()
                yield None
                return
            held = os.fstat(lock.fileno())
            try:
                current = os.stat(lock_path)
            except FileNotFoundError:  # unlinked by the holder we waited for
                current = None
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break
        except BaseException:
            lock.close()
            raise
        lock.close()  # releases the lock on the unlinked file; try the current one
    try:
        if holder:
            lock.truncate(0)
            lock.write(holder)
            lock.flush()
        yield lock
    finally:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock_path)  # still held: nobody can have replaced it
        finally:
            lock.close()  # releases the lock


def this_process() -> str:
    """This process as a lock's holder: ``pid <pid> on <host> (<program> <subcommand>)``. Not the
    whole command line: the lock file may be readable by others, and arguments can hold secrets
    (storage options)."""
    words = [os.path.basename(sys.argv[0])] + [a for a in sys.argv[1:2] if not a.startswith("-")] if sys.argv else []
    return f"pid {os.getpid()} on {socket.gethostname()} ({' '.join(words) or 'python'})"


def holder_of(lock_path: str) -> str:
    """What the holder of ``lock_path`` wrote into it (empty if nothing, or it is gone)."""
    try:
        with open(lock_path) as f:
            return f.read(300).strip()
    except OSError:
        return ""
