"""The POSIX semaphores a pack's worker pool names in /dev/shm: which a process has mapped, and
those of the packs a test starts, told apart by a prefix of the test's own."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from pathlib import Path

from tests.pack.resume_checks import arguments

# The pack's CLI with its POSIX semaphores named "<prefix>-<random>" instead of multiprocessing's
# "/mp-<random>" (``semprefix``, a CPython detail, checked here so that a Python without it fails
# loudly instead of leaving the names unfound).
PACK_WITH_PREFIX = (
    "import sys, multiprocessing.process as p, multiprocessing.synchronize as s;"
    "p.current_process()._config['semprefix'] = prefix = sys.argv.pop(1);"
    "assert s.SemLock._make_name().startswith(prefix + '-'), 'semprefix is not used any more';"
    "from shardkit.cli import main; main()"
)


class PackSemaphores:
    """The semaphore names in /dev/shm of the packs a test starts, told from any other process's by
    a prefix of the test's own. A ``kill -9`` of the whole process group while the pool's workers
    start leaves them there for good: the resource tracker, which would remove them, dies with the
    group, and the pack removes them only once every worker has opened them (``pack/pool.py``)."""

    def __init__(self) -> None:
        self.prefix = f"/shardkit-test-{uuid.uuid4().hex[:12]}"

    def command(self, src, dst, *extra) -> list[str]:
        return [sys.executable, "-c", PACK_WITH_PREFIX, self.prefix, *arguments(src, dst, *extra)]

    def left(self) -> list[str]:
        shm, start = Path("/dev/shm"), f"sem.{self.prefix[1:]}-"
        return sorted(p.name for p in shm.iterdir() if p.name.startswith(start)) if shm.is_dir() else []

    def remove(self) -> list[str]:
        left = self.left()
        for name in left:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")
        return left


def mapped_semaphores(pid: int, deleted: bool = False) -> set[str]:
    """The POSIX named semaphores (``/dev/shm/sem.*``) process ``pid`` has mapped: those whose name
    still exists, or with ``deleted`` those whose name was removed."""
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                path, gone = fields[5].rstrip("\n").removesuffix(" (deleted)"), fields[5].rstrip().endswith("(deleted)")
                if gone == deleted:
                    found.add(path)
    return found
