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

from shardkit.storage.locks import locked

__all__ = ["cached_copy"]


def cached_copy(directory: str, name: str, sha256: str, fetch: Callable[[], bytes]) -> bytes:
    """The bytes whose sha256 is ``sha256``: from ``directory/name`` when the copy there hashes to
    it, else from ``fetch()`` (which must return bytes hashing to ``sha256`` or raise), then kept
    there for the node's other processes.

    Raises:
        ValueError: ``fetch()`` returned other bytes.
        OSError: the directory cannot be created or written.
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
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
