"""Node-local copies of small files known by their sha256: fetched once per node, shared by its
processes (ranks, workers), checked on every use.

``<directory>/<name>`` is read under an exclusive ``flock`` (:func:`~shardkit.storage.locks.locked`):
the first process finds no copy (or one whose bytes no longer hash to ``sha256``), fetches the
file, writes ``<name>.tmp-<pid>`` and renames it into place; the processes that waited on the
lock then read that copy. Every read hashes the copy, so a copy damaged or replaced on disk is
fetched again, never used. The loader keeps a remote dataset's ``index.table`` here, beside its
shard cache (:mod:`shardkit.loader.read.cache`); these files are small and outside the cache's
byte budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable

from shardkit.errors import StorageError
from shardkit.storage.locks import locked

__all__ = ["cached_copy", "make_cache_dir"]


def make_cache_dir(directory: str) -> None:
    """Create the cache ``directory`` (mode ``0700``) unless it exists.

    Raises:
        StorageError: it cannot be made (a file of that name is in the way, no permission, a
            read-only file system), naming it: the loader's ``cache_dir``, or the default one.
    """
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as err:
        why = ("a file of that name is in the way" if isinstance(err, FileExistsError)
               else "a file on its path is in the way" if isinstance(err, NotADirectoryError)
               else err.strerror or str(err))
        raise StorageError(f"cannot make the shard cache directory here ({why}); choose a directory you can "
                           "write: ShardLoader(cache_dir=...), or XDG_CACHE_HOME for the default one",
                           where=directory) from err


def cached_copy(directory: str, name: str, sha256: str, fetch: Callable[[], bytes]) -> bytes:
    """The bytes whose sha256 is ``sha256``: from ``directory/name`` when the copy there hashes to
    it, else from ``fetch()`` (which must return bytes hashing to ``sha256`` or raise), then kept
    there for the node's other processes.

    Raises:
        ValueError: ``fetch()`` returned other bytes.
        StorageError: the directory cannot be created.
        OSError: the directory cannot be written.
    """
    make_cache_dir(directory)
    path = os.path.join(directory, name)
    with locked(f"{path}.lock"):
        with contextlib.suppress(FileNotFoundError):
            with open(path, "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() == sha256:
                return data
        data = fetch()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"fetched bytes for {name} do not hash to {sha256}")
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        return data
