"""One directory of files, on local disk or behind any fsspec URL, with atomic writes.

Local paths use ``os`` directly (the fast path); anything with a scheme (``s3://``,
``memory://``, ``gcs://`` …) goes through fsspec. Filesystem objects are created lazily in the
process that uses them, so a ``Store`` pickles cheaply to worker processes.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, TypeVar, cast

from shardkit.errors import StorageError
from shardkit.storage import _remote
from shardkit.storage.buckets import bucket_of, check_bucket
from shardkit.storage.local import describe_local_error, open_regular
from shardkit.storage.urls import is_remote, local_path, url_typo

# Object stores where a plain write only becomes visible once complete (multipart commit).
_ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})

_T = TypeVar("_T")
#: Held while a store makes its filesystem (creating an s3fs client takes ~0.5 s of CPU: eight
#: threads making eight of them at once took 7 s).
_FS_LOCK = threading.Lock()


def _leaf(name: str) -> str:
    """The last component of an object-store path (``bucket/a/b/`` -> ``b``)."""
    return name.rstrip("/").rsplit("/", 1)[-1]


class Store:
    """Files under ``url`` (a local directory or an fsspec URL prefix).

    Example::

        store = Store("s3://bucket/train", {"anon": False})
        with store.write_atomic("index.json") as f:
            f.write(b"{}")
        store.read_bytes("index.json")
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.remote = is_remote(url)
        if not self.remote:
            url = os.path.expanduser(url)  # "~/data", as torchvision's datasets take a root
        self.url = url.rstrip("/") if url not in ("/", "") else url
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise StorageError(f"storage_options must be a mapping of fsspec options ({{'anon': True}}), not "
                               f"{storage_options!r:.80}", where=self.url)
        self.storage_options = dict(storage_options or {})
        if not self.remote and (typo := url_typo(url)):
            raise StorageError(typo)
        if self.remote and (problem := _remote.check_options(url.split("://", 1)[0], self.storage_options)):
            raise StorageError(problem, where=self.url)
        self._fs: Any = None
        self._fs_pid = 0  # the process that made _fs: async filesystems (s3fs) are not fork-safe
        self._bucket_seen = bucket_of(self.url) is None  # no bucket to check (local, memory://)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # re-created in the receiving process (fsspec caches are per process)
        return state

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def fs(self) -> Any:
        """The fsspec filesystem for a remote store (created on first use in each process, so a
        forked DataLoader worker never reuses its parent's event loop)."""
        if self._fs is None or self._fs_pid != os.getpid():
            with _FS_LOCK:  # threads reading from one store make its filesystem once, not each
                if self._fs is None or self._fs_pid != os.getpid():
                    self._fs = self._make_fs()
                    self._fs_pid = os.getpid()
        return self._fs

    def _make_fs(self) -> Any:
        import fsspec

        protocol = self.url.split("://", 1)[0]
        try:
            fs = fsspec.filesystem(protocol,
                                   **_remote.filesystem_options(protocol, self.storage_options))
        except (ImportError, ValueError) as err:
            raise StorageError(f"cannot open filesystem {protocol!r}: {err}", where=self.url) from err
        _remote.tune(fs, protocol)
        return fs

    @property
    def process_local(self) -> bool:
        """Whether files written here are visible only to this process (``memory://``)."""
        return self.remote and self.url.split("://", 1)[0] == "memory"

    def path(self, name: str) -> str:
        """Full path or URL of file ``name`` in this store."""
        base = self.url if self.remote else local_path(self.url)
        return f"{base}/{name}" if name else base

    def child(self, name: str) -> Store:
        """The store for sub-directory ``name``."""
        child = Store(self.path(name), self.storage_options)
        child._bucket_seen = self._bucket_seen
        return child

    def _check_bucket(self) -> None:
        """Raise ``StorageError`` naming the bucket if it does not exist (asked once per store).

        Called where the store would otherwise report "not found" or create the bucket.
        """
        if self._bucket_seen:
            return
        with self._errors(""):
            check_bucket(self.fs, self.url)
        self._bucket_seen = True

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """Turn errors of the store's own calls into ``StorageError`` naming the file.

        Never wrap a caller's code in this: its errors must keep their type.
        """
        try:
            yield
        except StorageError:
            raise
        except FileNotFoundError as err:
            self._check_bucket()  # "no such file" in a missing bucket: name the bucket instead
            raise StorageError("no such file", where=self.path(name)) from err
        except Exception as err:
            message = _remote.describe(err) if self.remote else describe_local_error(err)
            if message is None and isinstance(err, (OSError, ValueError)):
                message = f"{type(err).__name__}: {err}"
            if message is None:
                raise
            raise StorageError(message, where=self.path(name)) from err

    def exists(self, name: str = "") -> bool:
        """Whether ``name`` (or the store itself) exists."""
        with self._errors(name):
            if self.remote:
                found = bool(_remote.retry(lambda: self.fs.exists(self.path(name))))
                if not found:
                    self._check_bucket()
                return found
            return os.path.exists(self.path(name))

    def listdir(self) -> list[str]:
        """Names directly under the store, sorted; ``[]`` if it does not exist."""
        if not self.remote:
            with self._errors(""):
                path = self.path("")
                return sorted(os.listdir(path)) if os.path.isdir(path) else []
        return sorted(_leaf(e["name"]) for e in self._remote_listing())

    def file_sizes(self) -> dict[str, int]:
        """``{name: bytes}`` of the files directly under the store, in one listing (a few paged
        requests on object stores, not one per file); ``{}`` if it does not exist."""
        if not self.remote:
            with self._errors(""):
                path = self.path("")
                if not os.path.isdir(path):
                    return {}
                with os.scandir(path) as found:
                    return {e.name: e.stat().st_size for e in found if e.is_file()}
        return {_leaf(e["name"]): int(e.get("size") or 0) for e in self._remote_listing()
                if e.get("type") != "directory"}

    def _remote_listing(self) -> list[dict[str, Any]]:
        """The entries (fsspec's details) directly under a remote store, fresh; ``[]`` if it does
        not exist (a missing bucket is an error naming it)."""
        with self._errors(""):
            if not _remote.retry(lambda: self.fs.exists(self.url)):
                self._check_bucket()
                return []
            # files written by other processes (pack workers) are not in the cache: refresh it
            # (adlfs ignores refresh=True and keeps a listing until its cache is invalidated)
            self.fs.invalidate_cache(self.url)
            return list(_remote.retry(lambda: self.fs.ls(self.url, detail=True, refresh=True)))

    def size(self, name: str, *, fresh: bool = False) -> int:
        """Size of file ``name`` in bytes (``fresh``: asked of the store, not of the client's cache
        of earlier listings, for a file another process may have written since)."""
        with self._errors(name):
            if self.remote:
                if fresh:
                    self.fs.invalidate_cache(self.path(name))
                return int(_remote.retry(lambda: self.fs.size(self.path(name))))
            return os.path.getsize(self.path(name))

    def open_read(self, name: str) -> BinaryIO:
        """Open file ``name`` for binary reading (caller closes)."""
        with self._errors(name):
            if self.remote:
                f = _remote.retry(lambda: self.fs.open(self.path(name), "rb"))
                return cast(BinaryIO, _RemoteFile(self, name, f))
            return os.fdopen(open_regular(self.path(name)), "rb")

    def read_bytes(self, name: str, *, limit: int | None = None) -> bytes:
        """The content of file ``name``: all of it, or its first ``limit`` bytes at most (so that
        a file larger than expected cannot exhaust memory)."""
        if self.remote:  # one GET (ranged with a limit), retried whole after a transient fault
            with self._errors(name):
                return bytes(_remote.retry(lambda: self.fs.cat_file(self.path(name), end=limit)))
        with self._errors(name), self.open_read(name) as f:
            return f.read(-1 if limit is None else limit)

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes of file ``name`` from byte ``offset`` (fewer at its end): one ranged GET
        on object stores (retried whole after a transient fault), one ``pread`` locally."""
        if self.remote:
            with self._errors(name):
                return bytes(_remote.retry(lambda: self.fs.cat_file(self.path(name), start=offset,
                                                                    end=offset + length)))
        with self._errors(name):
            fd = open_regular(self.path(name))
            try:
                return os.pread(fd, length, offset)
            finally:
                os.close(fd)

    def call(self, name: str, operation: Callable[[Any], _T]) -> _T:
        """Run ``operation(fs)``, an idempotent call on this store's fsspec filesystem about file
        (or directory) ``name``, with shardkit's retries and errors: retried after a transient
        fault; a failure becomes ``StorageError`` naming ``name`` (a missing bucket named as
        such). For remote stores only.

        Example::

            entries = store.call("", lambda fs: fs.ls(store.url, detail=True))
        """
        if not self.remote:
            raise ValueError(f"Store.call needs an fsspec URL, not the local path {self.url!r}")
        with self._errors(name):
            return _remote.retry(lambda: operation(self.fs))

    def read_optional(self, name: str) -> bytes | None:
        """The content of file ``name``, or ``None`` if it does not exist (one request on object
        stores, where ``exists`` + ``read_bytes`` would be two)."""
        try:
            return self.read_bytes(name)
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):
                return None
            raise

    def makedirs(self) -> None:
        """Create the store's directory. Object stores have no directories: there the bucket must
        exist (``StorageError`` naming it otherwise); it is never created."""
        with self._errors(""):
            if self.remote and bucket_of(self.url) is not None:
                self._check_bucket()
            elif self.remote:
                self.fs.makedirs(self.url, exist_ok=True)
            else:
                path = self.path("")
                if os.path.exists(path) and not os.path.isdir(path):
                    raise StorageError("is a file, not a directory", where=path)
                try:
                    os.makedirs(path, exist_ok=True)
                except FileNotFoundError as err:  # a parent this system will not create (/proc/x/y)
                    made = next((p for p in pathlib.Path(path).parents if p.exists()), None)
                    raise StorageError(f"cannot create this directory (creating {err.filename} failed under "
                                       f"{made})", where=path) from err

    def remove(self, name: str, *, missing_ok: bool = True) -> None:
        """Delete file ``name`` (or a sub-directory, recursively)."""
        with self._errors(name):
            path = self.path(name)
            if self.remote:
                if _remote.retry(lambda: self.fs.exists(path)):
                    _remote.retry(lambda: self.fs.rm(path, recursive=True))
                elif not missing_ok:
                    raise FileNotFoundError(path)
            elif os.path.isdir(path):
                import shutil

                shutil.rmtree(path)
            elif os.path.exists(path) or not missing_ok:
                os.remove(path)

    @contextlib.contextmanager
    def write_atomic(self, name: str) -> Iterator[BinaryIO]:
        """Write file ``name`` so that it appears complete or not at all.

        Local: a temporary sibling ``.<name>.tmp-<random>`` is written, fsynced and renamed.
        Object stores (s3, gcs, azure): the upload is committed only on a clean close. Other
        fsspec filesystems: temporary name then move. On error nothing is left behind.
        """
        tmp_name = f".{name}.tmp-{uuid.uuid4().hex[:12]}"
        if not self.remote:
            tmp = self.path(tmp_name)
            f: BinaryIO | None = None
            try:  # opened inside: a Ctrl-C between the open and the body leaves no empty temporary
                with self._errors(name):
                    f = open(tmp, "wb")  # noqa: SIM115 (closed below on every path; the caller's body must stay outside _errors)
                yield f
                with self._errors(name):
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                    os.replace(tmp, self.path(name))
            finally:
                if f is None or not f.closed or os.path.exists(tmp):
                    self._discard_local(f, tmp)
            return
        protocol = self.url.split("://", 1)[0]
        direct = protocol in _ATOMIC_PUT_PROTOCOLS
        target = self.path(name if direct else tmp_name)
        with self._errors(name):
            f = self.fs.open(target, "wb")
        try:
            yield f
        except BaseException:
            with self._errors(name):
                self._abandon(f, target, direct)
            raise
        with self._errors(name):
            f.close()
            if not direct:
                self.fs.mv(target, self.path(name))

    @staticmethod
    def _discard_local(f: BinaryIO | None, tmp: str) -> None:
        """Drop a failed local write (``f`` None: interrupted as it opened); best effort, so the
        error that caused it is what surfaces."""
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        with contextlib.suppress(OSError):  # a leftover temporary is removed by the next pack
            os.remove(tmp)

    def _abandon(self, f: Any, target: str, direct: bool) -> None:
        """Drop a failed remote write so that nothing of it stays visible."""
        if direct and hasattr(f, "discard"):
            f.discard()  # abort the multipart upload / drop the buffer: nothing was published
            # s3fs leaves the file "open" after discard and would upload on garbage collection.
            with contextlib.suppress(AttributeError):
                f.closed = True
            return
        # Other filesystems (memory://, …) may show the file from open(): remove the temporary.
        f.close()
        if self.fs.exists(target):
            self.fs.rm(target)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Atomically write ``data`` to file ``name`` (remote: retried whole after a transient
        fault; each attempt publishes all of ``data`` or nothing)."""
        if not self.remote:
            with self.write_atomic(name) as f:
                f.write(data)
            return

        def attempt() -> None:
            with self.write_atomic(name) as f:
                f.write(data)

        _remote.retry(attempt)  # write_atomic raises StorageError; retry looks at its cause



class _RemoteFile:
    """A remote file open for reading whose reads are retried after transient faults (a read is
    a ranged GET: repeating it is safe) and whose errors become ``StorageError`` naming it."""

    def __init__(self, store: Store, name: str, f: Any) -> None:
        self._store, self._name, self._f = store, name, f

    def read(self, size: int = -1) -> bytes:
        with self._store._errors(self._name):
            return bytes(_remote.retry(lambda: self._f.read(size)))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        with self._store._errors(self._name):
            return int(self._f.seek(offset, whence))

    def __getattr__(self, attr: str) -> Any:  # tell, seekable, readable, closed, size, …
        return getattr(self._f, attr)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> _RemoteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._f)
