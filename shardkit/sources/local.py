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


def walk_following_links(top: str) -> tuple[list[tuple[str, list[str]]], list[tuple[str, str]]]:
    """What ``sorted(os.walk(top, followlinks=True))`` gives, as ``(dirpath, filenames)``, and the
    folders it would have passed over or followed for ever, as ``(path, why)``.

    ``os.walk`` drops a folder it cannot list without a word, and follows a link that leads back
    to a folder above it (``self -> .``, ``up -> ..``) until the path is too long to resolve: one
    image found dozens of times, or, with two such links, a walk that never ends. Here such a link
    (to ``top``, a folder inside the walk above it, or one above ``top``) is not followed and such
    a folder is reported; every other link is followed, as ``os.walk`` does (two links to one
    folder list its files twice, as torchvision's ImageFolder does).
    """
    found: list[tuple[str, list[str]]] = []
    problems: list[tuple[str, str]] = []
    try:
        os.stat(top)
    except OSError as err:
        return found, [(top, f"unreadable folder ({err.strerror or err})")]
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = [(top, _folders_above(top))]
    while stack:
        path, above = stack.pop()
        try:
            with os.scandir(path) as listing:
                entries = list(listing)
        except OSError as err:
            problems.append((path, f"unreadable folder ({err.strerror or err})"))
            continue
        files = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if not is_dir:
                files.append(entry.name)
                continue
            try:
                st = os.stat(entry.path)
            except OSError as err:
                problems.append((entry.path, f"unreadable folder ({err.strerror or err})"))
                continue
            key = (st.st_dev, st.st_ino)
            if key in above:
                problems.append((entry.path, "leads back to a folder above it (a loop of links): not followed"))
                continue
            stack.append((entry.path, above | {key}))
        found.append((path, files))
    found.sort(key=lambda item: item[0])
    problems.sort()
    return found, problems


def _folders_above(top: str) -> frozenset[tuple[int, int]]:
    """``top`` and every folder above it, up to ``/``, by its real path and by the path it was
    named by, as ``(device, inode)``: a link to any of them leads back into ``top`` (``a/up -> ..``
    from a class folder ``a``)."""
    keys = set()
    for start in (os.path.realpath(top), os.path.abspath(top)):  # above it as resolved, and as named
        folder = start
        while True:
            try:
                st = os.stat(folder)
            except OSError:
                break
            keys.add((st.st_dev, st.st_ino))
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return frozenset(keys)


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
            found, problems = walk_following_links(os.path.join(self.root, d))
            entries = [FileEntry(path, self._rel(path), -1, "", problem) for path, problem in problems]
            for dirpath, fnames in found:
                for fname in sorted(fnames):
                    path = os.path.join(dirpath, fname)
                    entries.append(_entry(path, self._rel(path)))
            out.append(entries)
        return out

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def stat(self, rels: Sequence[str]) -> list[FileEntry]:
        return [_entry(os.path.join(self.root, *rel.split("/")), rel) for rel in rels]

    def read_each(self, samples: Sequence[SourceSample]) -> Generator[bytes | SkipSample, None, None]:
        # One file at a time: local reads are fast, and the pack's processes are the concurrency.
        for sample in samples:
            try:
                yield read_local(sample.path)
            except SkipSample as skip:
                yield skip
