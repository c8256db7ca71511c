"""A node-local cache of remote shards: content-addressed, fetched once per node, LRU-bounded.

A shard is cached as ``<cache_dir>/<sha256>.tar`` where ``sha256`` is the manifest's hash of
its bytes, so re-packing new content into the same URL never reuses stale bytes: a new hash is a
new file. Every fetched copy is hashed as it streams in and installed only if its sha256 and
size equal the manifest's (a damaged or substituted download is refused, naming the shard; a
fetch stops as soon as the object outgrows ``num_bytes``). A cached file is reused if its size
still equals ``num_bytes`` and, the first time a process uses it, its bytes still hash to the
manifest's ``sha256`` (anyone who can write to the cache directory could have replaced it with
other bytes of the same size); a mismatch is fetched again.

The default directory (:func:`default_cache_dir`) is the user's own, ``$XDG_CACHE_HOME/shardkit``
(``~/.cache/shardkit``), created ``0700``; a default directory owned by another user or writable
by others is refused. A fetch writes ``<file>.tmp-<pid>`` and renames it; the temporary files of
processes that died mid-fetch (``kill -9``) are removed by the next eviction pass.

Fetching holds an exclusive ``fcntl.flock`` on ``<file>.lock``, so of all the processes of a
node (ranks, DataLoader workers) one downloads a shard and the others wait, then reuse it. The
descriptor is opened while that lock is held. The ``.lock`` file is unlinked before the lock is
released (after a shard is installed or opened, and after an eviction), so the cache holds no
lock files once no process is using it (:func:`~shardkit.storage.locks.locked` says why that
stays exclusive). Eviction
removes the least recently used files (modification time, refreshed on every open) until the
cache holds at most ``budget`` bytes, skipping the file just opened and any file whose lock
another process holds. Eviction only unlinks: descriptors already open keep reading the bytes
(POSIX), which are freed when closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
from collections.abc import Iterator

from shardkit.errors import LoaderError
from shardkit.index._shard_list import SHA256_RE
from shardkit.index.manifest import ShardEntry
from shardkit.storage import Store
from shardkit.storage.copies import make_cache_dir
from shardkit.storage.locks import locked

__all__ = ["DEFAULT_CACHE_BYTES", "ShardCache", "default_cache_dir"]

#: Default byte budget of the shard cache (20 GB): many times a typical 100 MB-1 GB shard, so the
#: window of shards being read stays cached, and small next to a training node's local disk.
DEFAULT_CACHE_BYTES = 20 * 10**9

_SUFFIX = ".tar"
#: A fetch's temporary file: ``<sha256>.tar.tmp-<pid>``.
_TMP_RE = re.compile(r"[0-9a-f]{64}\.tar\.tmp-([0-9]+)")
#: A temporary file whose process is gone is removed once it has not changed for this long (a
#: process in another PID namespace sharing the cache may still be writing it).
_STALE_TMP_S = 60.0
#: ``(device, inode)`` of the cached files whose bytes this process has hashed (or fetched).
_VERIFIED: set[tuple[int, int]] = set()


def default_cache_dir() -> str:
    """The user's own shard cache: ``$XDG_CACHE_HOME/shardkit``, else ``~/.cache/shardkit``.

    Not the shared temporary directory: there another user could create the directory first,
    world-writable, and put files in it.
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardkit")


def private_dir(path: str) -> None:
    """Create ``path`` (mode ``0700``) unless it exists; refuse one that another user owns or that
    others may write to (``LoaderError`` naming it and what is wrong; ``StorageError`` where it
    cannot be made)."""
    make_cache_dir(path)
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise LoaderError(f"the shard cache directory belongs to user id {st.st_uid}, not to you "
                          f"({os.getuid()}); pass cache_dir= a directory of your own", where=path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LoaderError(f"the shard cache directory is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                          "`chmod 700` it or pass cache_dir= a directory of your own", where=path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _hash_fd(fd: int) -> tuple[int, str]:
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, 8 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return offset, digest.hexdigest()


@contextlib.contextmanager
def _locked(path: str, *, blocking: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock of ``path`` (``path + ".lock"``, see :func:`shardkit.storage.locks.locked`);
    yields False when ``blocking=False`` and another process holds it."""
    with locked(f"{path}.lock", blocking=blocking) as lock:
        yield lock is not None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return -1


class ShardCache:
    """Local copies of remote shards under ``directory``, at most about ``budget`` bytes.

    Picklable (holds only the directory and budget); safe to use from many processes at once.

    Raises:
        LoaderError: ``budget`` is not positive.
    """

    def __init__(self, directory: str, budget: int = DEFAULT_CACHE_BYTES, *, private: bool = False) -> None:
        if budget <= 0:
            raise LoaderError(f"cache_bytes must be > 0, got {budget}")
        self.directory, self.budget = directory, budget
        #: Whether ``directory`` must be the user's own (the default directory; checked on first use).
        self.private = private

    def path(self, entry: ShardEntry) -> str:
        """Where ``entry``'s bytes are cached.

        Raises:
            LoaderError: ``entry.sha256`` is not 64 lower-case hex digits (it names the file, so
                anything else could point outside ``directory``).
        """
        if not SHA256_RE.fullmatch(entry.sha256):
            raise LoaderError(f"refusing to cache a shard whose sha256 {entry.sha256[:80]!r} is not 64 lower-case "
                              f"hex digits (it would name a file outside {self.directory})", where=entry.url)
        return os.path.join(self.directory, entry.sha256 + _SUFFIX)

    def open(self, store: Store, entry: ShardEntry) -> int:
        """A read-only descriptor of a local copy of ``entry`` (fetched from ``store`` if needed).

        Raises:
            LoaderError: the fetched file's size differs from the manifest's ``num_bytes``.
            StorageError, OSError: the shard cannot be read or the cache written.
        """
        path = self.path(entry)
        if self.private:
            private_dir(self.directory)
        else:
            make_cache_dir(self.directory)
        with _locked(path):
            fd = self._open_verified(store, entry, path)
            os.utime(path)  # most recently used
        self._evict(keep=path)
        return fd

    def _open_verified(self, store: Store, entry: ShardEntry, path: str) -> int:
        """A descriptor of ``path`` holding ``entry``'s bytes: the cached file when its size and
        (the first time this process uses it) its sha256 match, else a fresh fetch."""
        if _size(path) == entry.num_bytes:
            fd = os.open(path, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                same = (st.st_dev, st.st_ino) in _VERIFIED or _hash_fd(fd) == (entry.num_bytes, entry.sha256)
            except BaseException:  # a read error (or Ctrl-C) while hashing: not left open
                os.close(fd)
                raise
            if same:
                _VERIFIED.add((st.st_dev, st.st_ino))
                return fd
            os.close(fd)  # same size, other bytes: replaced in the cache; fetch it again
        self._fetch(store, entry, path)
        fd = os.open(path, os.O_RDONLY)
        st = os.fstat(fd)
        _VERIFIED.add((st.st_dev, st.st_ino))  # hashed as it streamed in
        return fd

    def _fetch(self, store: Store, entry: ShardEntry, path: str) -> None:
        tmp = f"{path}.tmp-{os.getpid()}"
        digest = hashlib.sha256()
        try:
            with store.open_read(entry.url) as src, open(tmp, "wb") as dst:
                got = 0
                while chunk := src.read(min(8 << 20, entry.num_bytes + 1 - got)):
                    dst.write(chunk)
                    digest.update(chunk)
                    got += len(chunk)
                    if got > entry.num_bytes:  # stop here: the object may be of any size
                        raise LoaderError(f"the object is larger than the {entry.num_bytes} bytes index.json says "
                                          "(the dataset changed while being read?)", where=store.path(entry.url))
            if got != entry.num_bytes:
                raise LoaderError(f"fetched {got} bytes, index.json says {entry.num_bytes} "
                                  "(the dataset changed while being read?)", where=store.path(entry.url))
            if digest.hexdigest() != entry.sha256:
                raise LoaderError(f"fetched bytes have sha256 {digest.hexdigest()}, index.json says {entry.sha256} "
                                  "(the shard is damaged or was replaced; `shardkit verify` checks the dataset)",
                                  where=store.path(entry.url))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)

    def _evict(self, keep: str) -> None:
        files = []
        for name in os.listdir(self.directory):
            if (tmp := _TMP_RE.fullmatch(name)) is not None:
                self._remove_stale(os.path.join(self.directory, name), int(tmp.group(1)))
            elif name.endswith(_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(os.path.join(self.directory, name))
                    files.append((st.st_mtime_ns, st.st_size, os.path.join(self.directory, name)))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):  # least recently used first
            if total <= self.budget:
                return
            if path == keep:
                continue
            with _locked(path, blocking=False) as mine:
                if mine:  # else someone is fetching or opening it right now
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
                    total -= size

    @staticmethod
    def _remove_stale(path: str, pid: int) -> None:
        """Remove a fetch's temporary file whose process is gone (killed mid-fetch) and that has not
        changed for :data:`_STALE_TMP_S`."""
        if pid == os.getpid() or _pid_alive(pid):
            return
        with contextlib.suppress(FileNotFoundError):
            if time.time() - os.stat(path).st_mtime > _STALE_TMP_S:
                os.remove(path)
