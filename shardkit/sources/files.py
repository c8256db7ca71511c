"""Where a source's files live: the one interface through which sources list and read them.

:class:`Files` has two implementations: :class:`~shardkit.sources.local.LocalFiles` (the local
file system, with the hostile-input rules: regular files only, nothing opened that could block
or never end) and :class:`~shardkit.sources.remote.RemoteFiles` (any fsspec URL, listed and read
with bounded concurrency and shardkit's retries). ImageFolder and COCO are written once against
:class:`Files`, so a tree packs to the same bytes from either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from shardkit.sources.sample import SourceSample

#: Input files larger than this are skipped unread: far above any real image file (PIL's pixel
#: limit allows ~270 MB uncompressed RGB), and well inside what a shard member may hold
#: (``MAX_MEMBER_BYTES``, 1 GiB), so every packed sample is one the loader reads.
MAX_INPUT_BYTES = 512 << 20


class SkipSample(Exception):
    """An input that is not packed; ``reason`` goes into ``index.json`` ``skipped``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def too_large(size: int) -> SkipSample:
    """The skip of an input of ``size`` bytes, over :data:`MAX_INPUT_BYTES`."""
    return SkipSample(f"file too large ({size} bytes; at most {MAX_INPUT_BYTES} are packed)")


@dataclass(frozen=True)
class FileEntry:
    """One file of a source: ``path`` (what :meth:`Files.read_each` reads: a path or URL),
    ``rel`` (relative to the root, ``/``-separated), ``size`` in bytes (-1: it cannot be
    stat'ed, e.g. a dangling link or a missing object) and ``version``, which changes when the
    file does (the modification time locally, the ETag on object stores)."""

    path: str
    rel: str
    size: int
    version: str
    #: Set on a folder that was not walked, and why (it cannot be read, or a link leads back to
    #: a folder above it): not a file, but a skipped input to report.
    problem: str = ""


class Files(ABC):
    """The files under ``root`` (a directory or an fsspec URL prefix): listed and read.

    Implementations are picklable (a pack sends them to its worker processes and Ray tasks) and
    raise :class:`~shardkit.errors.SourceError` or :class:`~shardkit.errors.StorageError`
    naming the path or URL concerned.
    """

    root: str
    #: Whether the files are behind a URL (so readable from any machine, not only this one).
    remote: bool
    #: Whether only this process sees the files (``memory://``): no other process may read them.
    process_local: bool = False

    @abstractmethod
    def is_dir(self) -> bool:
        """Whether ``root`` is an existing directory (on object stores: a prefix with objects)."""

    @abstractmethod
    def subdirs(self) -> list[str]:
        """Sorted names of the directories directly under ``root`` (links followed).

        Raises:
            SourceError: ``root`` does not exist, is not a directory or cannot be listed.
        """

    @abstractmethod
    def walk(self, dirs: Sequence[str]) -> list[list[FileEntry]]:
        """For each of ``dirs`` (relative to ``root``), every file under it, recursively (links
        followed), in the order of ``sorted(os.walk(...))``: by directory, then by name. A
        folder that could not be walked comes as an entry with :attr:`FileEntry.problem` set."""

    @abstractmethod
    def stat(self, rels: Sequence[str]) -> list[FileEntry]:
        """The entries of the files ``root/rel`` (size -1 for those that do not exist)."""

    @abstractmethod
    def read_each(self, samples: Sequence[SourceSample]) -> Generator[bytes | SkipSample, None, None]:
        """The content of each sample's file, in order, or the :class:`SkipSample` saying why
        it is not packed (unreadable, empty, too large, not a regular file). Errors that are
        not the input's fault (the network, credentials) are raised: the pack stops there and
        resumes when re-run."""
