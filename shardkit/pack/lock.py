"""One pack at a time per destination: a lock held from the first look at DST to the last file.

Two packs into one directory (``--overwrite`` or not) would remove, resume and publish each
other's shards. ``pack`` holds an exclusive ``flock`` on ``.<name>.shardkit-lock`` beside a local
DST for its whole run; a second pack is refused at once, naming the holder (pid, host and
command). Where DST's parent cannot be written (a dataset directory under a read-only mount
point), the lock lives in the user's cache directory instead, named by DST's absolute path. The
lock file is removed when the pack ends; after a ``kill -9`` it stays, unlocked, and the next pack
takes it. Object-store destinations have no such lock; there, a pack checks before it publishes
that its shards are still there at their sizes (``pack.api``), so a second pack that rewrote them
makes it fail rather than publish.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator

from shardkit.errors import PackError
from shardkit.storage import Store
from shardkit.storage.locks import holder_of, locked, this_process


def lock_path(store: Store) -> str | None:
    """Where the lock of a local destination lives (beside it, so ``--overwrite`` never removes
    it and an empty DST stays empty); None for an object store."""
    if store.remote:
        return None
    dst = os.path.abspath(store.path("").rstrip("/") or "/")
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.shardkit-lock")


def _fallback_path(beside: str) -> str:
    """The lock of the destination whose lock would be ``beside``, in the user's cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = hashlib.sha256(beside.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(base, "shardkit", "locks", f"{name}.lock")


@contextlib.contextmanager
def destination_lock(store: Store) -> Iterator[None]:
    """Hold ``store``'s destination lock for the body.

    Raises:
        PackError: another pack holds it (naming that pack's process).
    """
    path = lock_path(store)
    if path is None:
        yield
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
    except OSError:  # DST's parent is not ours to write (permissions, a read-only mount): lock in our cache
        path = _fallback_path(path)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with locked(path, blocking=False, holder=this_process()) as lock:
        if lock is None:
            holder = holder_of(path) or "a process that has not yet said which"
            raise PackError(f"another pack is writing here ({holder}); wait for it to finish or stop it",
                            where=store.url)
        yield
