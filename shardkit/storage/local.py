"""Local files: open one for reading only if it is a regular file, and say in plain words what a
local path error or a file that is not a regular one is."""

from __future__ import annotations

import errno
import os
import pathlib
import stat

from shardkit.errors import StorageError

__all__ = ["describe_local_error", "file_kind", "open_regular"]


def describe_local_error(err: Exception) -> str | None:
    """Plain words for a local path error (None: Python's own are fine)."""
    if isinstance(err, NotADirectoryError):
        path = pathlib.Path(str(err.filename or ""))
        blocker = next((p for p in (path, *path.parents) if p.exists()), path)
        return f"{blocker} is a file, not a directory"
    if isinstance(err, PermissionError):
        return f"permission denied ({err.filename})" if err.filename else "permission denied"
    if isinstance(err, OSError) and err.errno in _PLAIN:
        return f"{_PLAIN[err.errno]} ({err.filename})" if err.filename else _PLAIN[err.errno]
    return None


#: Errors a local write meets, in words (the rest keep Python's).
_PLAIN = {errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the device",
          errno.EDQUOT: "disk quota exceeded", errno.ENAMETOOLONG: "file name too long"}


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (``st_mode`` from ``os.stat``)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return f"file type {stat.S_IFMT(mode):o}"


def open_regular(path: str) -> int:
    """Open the local file ``path`` for reading and return its descriptor, refusing anything but
    a regular file with ``StorageError`` naming it.

    A shard or index that is a FIFO would block ``open`` until a writer came (for ever), and a
    device such as ``/dev/zero`` would never end: the open does not block (``O_NONBLOCK``) and the
    opened file is checked, not the path (which may change between a ``stat`` and the ``open``).
    Links are followed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StorageError(f"not a regular file ({file_kind(mode)})", where=path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
