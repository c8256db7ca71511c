"""Source files on the local file system, read under the hostile-input rules.

Only regular files are read: a FIFO, a device (e.g. a link to ``/dev/zero``), a socket or a
directory is skipped with a reason, never opened for reading (a FIFO would wait for a writer
for ever). Files are read in chunks up to :data:`~shardkit.sources.files.MAX_INPUT_BYTES`, so
one that is huge, or grows while it is read, cannot exhaust memory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Generator, Sequence

from shardkit.errors import SourceError
from shardkit.sources.files import MAX_INPUT_BYTES, FileEntry, Files, SkipSample, too_large
from shardkit.sources.sample import SourceSample
from shardkit.storage.local import file_kind

_CHUNK = 1 << 20


def read_local(path: str) -> bytes:
    """Read the input file ``path``; raise :class:`SkipSample` if it cannot be read, is empty,
    is not a regular file or is larger than :data:`MAX_INPUT_BYTES`.

    Links are followed (ImageFolder does). Only regular files are opened, without blocking, and
    what was opened is checked again (the path may have changed since the first stat).
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise SkipSample(f"not a regular file ({file_kind(st.st_mode)})")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise SkipSample(f"unreadable file ({err.strerror or err})") from err
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SkipSample(f"not a regular file ({file_kind(st.st_mode)})")
            if st.st_size > MAX_INPUT_BYTES:
                raise too_large(st.st_size)
            chunks, total = [], 0
            while total <= MAX_INPUT_BYTES and (chunk := f.read(min(_CHUNK, MAX_INPUT_BYTES + 1 - total))):
                chunks.append(chunk)
                total += len(chunk)
        except OSError as err:
            raise SkipSample(f"unreadable file ({err.strerror or err})") from err
    if total > MAX_INPUT_BYTES:
        raise SkipSample(f"file too large (grew past {MAX_INPUT_BYTES} bytes while being read)")
    if not total:
        raise SkipSample("empty file (0 bytes)")
    return b"".join(chunks)


def _entry(path: str, rel: str) -> FileEntry:
    try:
        st = os.stat(path)
    except OSError:
        return FileEntry(path, rel, -1, "")
    return FileEntry(path, rel, st.st_size, str(st.st_mtime_ns))


class LocalFiles(Files):
    """The files under the local directory ``root`` (``~`` expanded; ``file://`` accepted).

    Example::

        files = LocalFiles("data/train")
        [entries] = files.walk(["cat"])
    """

    remote = False

    def __init__(self, root: str = "") -> None:
        root = root[len("file://"):] if root.startswith("file://") else root
        self.root = os.path.expanduser(root)

    def __repr__(self) -> str:
        return f"LocalFiles({self.root!r})"

    def is_dir(self) -> bool:
        return os.path.isdir(self.root)

    def subdirs(self) -> list[str]:
        try:
            with os.scandir(self.root) as entries:
                return sorted(e.name for e in entries if e.is_dir())
        except FileNotFoundError as err:
            raise SourceError("source directory does not exist", where=self.root) from err
        except NotADirectoryError as err:
            raise SourceError("source is not a directory", where=self.root) from err
        except OSError as err:
            raise SourceError(f"cannot list source directory: {err.strerror}",
                              where=self.root) from err

    def walk(self, dirs: Sequence[str]) -> list[list[FileEntry]]:
        out = []
        for d in dirs:
            entries = []
            for dirpath, _, fnames in sorted(os.walk(os.path.join(self.root, d), followlinks=True)):
                for fname in sorted(fnames):
                    path = os.path.join(dirpath, fname)
                    entries.append(_entry(path, os.path.relpath(path, self.root).replace(os.sep, "/")))
            out.append(entries)
        return out

    def stat(self, rels: Sequence[str]) -> list[FileEntry]:
        return [_entry(os.path.join(self.root, *rel.split("/")), rel) for rel in rels]

    def read_each(self, samples: Sequence[SourceSample]) -> Generator[bytes | SkipSample, None, None]:
        # One file at a time: local reads are fast, and the pack's processes are the concurrency.
        for sample in samples:
            try:
                yield read_local(sample.path)
            except SkipSample as skip:
                yield skip
