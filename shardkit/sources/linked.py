"""Source files named one by one (the rows of a caption table): each sample's ``path`` is a local
path or an fsspec URL of its own (``https://host/a.jpg``, ``s3://bucket/b.jpg``), not a file under
one root.

Local paths are read under the local hostile-input rules (:func:`~shardkit.sources.local.read_local`);
URLs through :class:`~shardkit.storage.Store` (its retries and one-line errors), at most
:data:`~shardkit.sources.remote.READ_THREADS` at a time per pack process, in order. What is skipped
matches the other sources: an empty or missing file (HTTP 404 included), one over
:data:`~shardkit.sources.files.MAX_INPUT_BYTES`. Any other failure of a URL (access denied, a server
error, the network after the retries) stops the pack with an error naming the URL, as for a bucket
source: the pack resumes when re-run, and the published dataset does not depend on the weather.
"""

from __future__ import annotations

import os
import posixpath
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardkit.errors import SourceError, StorageError
from shardkit.sources.files import MAX_INPUT_BYTES, FileEntry, Files, SkipSample, too_large
from shardkit.sources.local import read_local
from shardkit.sources.remote import READ_THREADS
from shardkit.sources.sample import SourceSample
from shardkit.storage import Store, is_remote

_MISSING = f"unreadable file ({os.strerror(2)})"  # ENOENT, in the local pack's words


def _split_url(url: str) -> tuple[str, str]:
    """``(parent URL, name)`` of a file URL; a query string stays with the name."""
    scheme, rest = url.split("://", 1)
    parent, _, name = rest.rpartition("/")
    if not parent or not name:
        raise SourceError("not the URL of a file", where=url)
    return f"{scheme}://{parent}", name


class LinkedFiles(Files):
    """Files given by full path or URL, one per sample; ``root`` names the listing they come from
    (the table), for messages and the pack's checks.

    Example::

        files = LinkedFiles("captions.csv", [])
        next(files.read_each([SourceSample("/data/a.jpg", "a.jpg", 10)]))
    """

    def __init__(self, root: str, urls: Sequence[str], storage_options: dict[str, Any] | None = None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})
        schemes = {u.split("://", 1)[0] for u in urls if is_remote(u)}
        #: Readable from any machine only when every file is behind a URL of a shared store.
        self.remote = bool(urls) and all(is_remote(u) for u in urls) and "memory" not in schemes
        self.process_local = "memory" in schemes
        self._stores: dict[str, Store] = {}

    def __repr__(self) -> str:
        return f"LinkedFiles({self.root!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_stores": {}}  # filesystems are made again in each process

    def is_dir(self) -> bool:
        return False

    def subdirs(self) -> list[str]:
        raise SourceError("a table of files has no folders to list", where=self.root)

    def walk(self, dirs: Sequence[str]) -> list[list[FileEntry]]:
        raise SourceError("a table of files has no folders to walk", where=self.root)

    def stat(self, rels: Sequence[str]) -> list[FileEntry]:
        """Entries of local paths (size -1 when missing); a URL's size is not asked for (0: unknown)."""
        out = []
        for path in rels:
            if is_remote(path):
                out.append(FileEntry(path, path, 0, ""))
                continue
            try:
                st = os.stat(path)
            except OSError:
                out.append(FileEntry(path, path, -1, ""))
            else:
                out.append(FileEntry(path, path, st.st_size, str(st.st_mtime_ns)))
        return out

    def _store(self, parent: str) -> Store:
        store = self._stores.get(parent)
        if store is None:
            store = self._stores[parent] = Store(parent, self.storage_options)
        return store

    def _read(self, sample: SourceSample) -> bytes | SkipSample:
        if not is_remote(sample.path):
            try:
                return read_local(sample.path)
            except SkipSample as skip:
                return skip
        parent, name = _split_url(sample.path)
        try:
            data = self._store(parent).read_bytes(name, limit=MAX_INPUT_BYTES + 1)
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):  # a 404, or an object deleted
                return SkipSample(_MISSING)
            raise
        if len(data) > MAX_INPUT_BYTES:
            return too_large(len(data))
        if not data:
            return SkipSample("empty file (0 bytes)")
        return data

    def read_each(self, samples: Sequence[SourceSample]) -> Generator[bytes | SkipSample, None, None]:
        if not any(is_remote(s.path) for s in samples):
            for sample in samples:  # local only: the pack's processes are the concurrency
                yield self._read(sample)
            return
        window: deque[Future[bytes | SkipSample]] = deque()
        with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="shardkit-read") as pool:
            try:
                for sample in samples:
                    if len(window) >= READ_THREADS:
                        yield window.popleft().result()
                    window.append(pool.submit(self._read, sample))
                while window:
                    yield window.popleft().result()
            finally:  # stopped early: drop reads not started
                for future in window:
                    future.cancel()


def resolve(value: str, base: str) -> str:
    """The file a table names: a URL or absolute path as it is, a relative path joined to ``base``
    (a directory or URL prefix).

    >>> resolve("img/a.jpg", "/data"), resolve("https://h/a.jpg", "/data"), resolve("b.jpg", "s3://x/y")
    ('/data/img/a.jpg', 'https://h/a.jpg', 's3://x/y/b.jpg')
    """
    if is_remote(value) or os.path.isabs(value):
        return value
    if is_remote(base):
        return posixpath.join(base.rstrip("/"), value)
    return os.path.join(base, value)
