"""Source files behind an fsspec URL (``s3://``, ``gs://``, ``memory://`` …), listed and read with
bounded concurrency through :class:`~shardkit.storage.Store` (its S3 timeouts, retries of
transient faults and one-line errors naming the URL).

Listing: one ``ls`` of the root, then one recursive ``find`` per class directory, at most
:data:`LIST_THREADS` at a time (a paginated listing is sequential: listing 1,000 classes side by
side is what makes a large bucket quick to list). Reading: at most :data:`READ_THREADS` objects
and :data:`READ_AHEAD_BYTES` in flight per process, in order. The size cap applies to the size
the listing gave, before anything is read; the read itself is ranged to the cap, so an object
replaced by a larger one since cannot exhaust memory either.

What is skipped matches a local pack of the same tree, reasons included: empty objects, objects
over the cap, and objects that do not exist (deleted since listed; a COCO record naming none).
An object that cannot be read (access denied; the network, after the retries) stops the pack
with an error naming its URL instead: skipping it would publish a dataset that depends on the
weather, and the pack resumes once it is fixed.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardkit.errors import SourceError, StorageError
from shardkit.sources.files import MAX_INPUT_BYTES, FileEntry, Files, SkipSample, too_large
from shardkit.sources.sample import SourceSample
from shardkit.storage import Store

#: Directory listings in flight at once (each a sequence of paginated requests).
LIST_THREADS = 16
#: Object reads in flight at once per pack process: enough to hide a round trip of tens of
#: milliseconds behind encoding, few enough that a pool of writers stays polite to the store.
READ_THREADS = 8
#: Bytes of listed size in flight at once per pack process (one larger object is still read).
READ_AHEAD_BYTES = 64 << 20

_MISSING = f"unreadable file ({os.strerror(errno.ENOENT)})"  # the local pack's words: same index


def _version(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "generation", "LastModified", "mtime", "last_modified", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def _refused_range(err: BaseException) -> bool:
    """Whether ``err`` comes from a ranged GET the store refused (HTTP 416: the object is empty)."""
    cur: BaseException | None = err
    for _ in range(8):
        if cur is None:
            return False
        response = getattr(cur, "response", None)
        if isinstance(response, dict) and (
                response.get("Error", {}).get("Code") == "InvalidRange"
                or response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class RemoteFiles(Files):
    """The files under the fsspec URL ``root``, reached with ``storage_options``.

    Example::

        files = RemoteFiles("s3://bucket/train", {"anon": True})
        files.subdirs()  # ['cat', 'dog']
    """

    remote = True

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.store = Store(root, storage_options)
        self.root = self.store.url
        self.process_local = self.store.process_local
        self._index: dict[str, FileEntry] | None = None  # every file under root, for stat()

    def __repr__(self) -> str:
        return f"RemoteFiles({self.root!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_index": None}  # workers read; they never list

    def _key(self, rel: str) -> str:
        """The filesystem's own name of ``root/rel`` (no protocol), as its listings give it."""
        return str(self.store.fs._strip_protocol(self.store.path(rel)))

    def _rel(self, name: str) -> str:
        return name[len(self._key("")) + 1:]

    def is_dir(self) -> bool:
        if not self.store.exists():  # names a missing bucket
            return False
        return bool(self.store.call("", lambda fs: fs.isdir(self.root)))

    def subdirs(self) -> list[str]:
        try:
            entries = self.store.call("", lambda fs: fs.ls(self.root, detail=True, refresh=True))
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):  # a missing bucket is named instead
                raise SourceError("source directory does not exist (no object under this prefix)",
                                  where=self.root) from err
            raise
        base = self._key("")
        if any(e["name"].rstrip("/") == base and e.get("type") != "directory" for e in entries):
            raise SourceError("source is not a directory (it is an object)", where=self.root)
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries
                      if e.get("type") == "directory")

    def _find(self, rel: str) -> list[FileEntry]:
        found = self.store.call(rel, lambda fs: fs.find(self.store.path(rel), detail=True))
        entries = []
        for name, info in found.items():
            if name.endswith("/") or info.get("type", "file") != "file":  # "folder" markers
                continue
            r = self._rel(name)
            entries.append(FileEntry(self.store.path(r), r, int(info.get("size") or 0),
                                     _version(info)))
        # sorted(os.walk()) order: directory by directory, names sorted within each
        return sorted(entries, key=lambda e: (posixpath.dirname(e.rel), posixpath.basename(e.rel)))

    def walk(self, dirs: Sequence[str]) -> list[list[FileEntry]]:
        if len(dirs) <= 1:
            return [self._find(d) for d in dirs]
        with ThreadPoolExecutor(min(LIST_THREADS, len(dirs)),
                                thread_name_prefix="shardkit-list") as pool:
            return list(pool.map(self._find, dirs))

    def stat(self, rels: Sequence[str]) -> list[FileEntry]:
        if self._index is None:  # one listing of the whole root: far fewer requests than a HEAD each
            [entries] = self.walk([""])
            self._index = {e.rel: e for e in entries}
        return [self._index.get(rel) or FileEntry(self.store.path(rel), rel, -1, "") for rel in rels]

    def _read(self, sample: SourceSample) -> bytes | SkipSample:
        if sample.size < 0:
            return SkipSample(_MISSING)
        if sample.size > MAX_INPUT_BYTES:
            return too_large(sample.size)
        if sample.size == 0:
            return SkipSample("empty file (0 bytes)")
        root = self.root + "/"
        if not sample.path.startswith(root):
            raise ValueError(f"{sample.path} is not under {self.root}")
        try:
            data = self.store.read_bytes(sample.path[len(root):], limit=MAX_INPUT_BYTES + 1)
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):  # deleted since it was listed
                return SkipSample(_MISSING)
            if _refused_range(err):  # emptied since it was listed
                return SkipSample("empty file (0 bytes)")
            raise
        if len(data) > MAX_INPUT_BYTES:
            return SkipSample(f"file too large (grew past {MAX_INPUT_BYTES} bytes since it was listed)")
        if not data:
            return SkipSample("empty file (0 bytes)")
        return data

    def read_each(self, samples: Sequence[SourceSample]) -> Generator[bytes | SkipSample, None, None]:
        window: deque[tuple[Future[bytes | SkipSample], int]] = deque()
        in_flight = 0
        with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="shardkit-read") as pool:
            try:
                for sample in samples:
                    size = max(sample.size, 0)
                    while window and (len(window) >= READ_THREADS
                                      or in_flight + size > READ_AHEAD_BYTES):
                        future, done = window.popleft()
                        in_flight -= done
                        yield future.result()
                    window.append((pool.submit(self._read, sample), size))
                    in_flight += size
                while window:
                    yield window.popleft()[0].result()
            finally:  # stopped early (an error, the consumer gone): drop reads not started
                for future, _ in window:
                    future.cancel()
