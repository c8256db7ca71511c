"""A pack's worker queues leave no named semaphore behind, even after a ``kill -9`` of the whole
process group: the parent unlinks their names as soon as every worker has opened them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from shardkit.pack import PackOptions, pack, pool


def _names(objects: list[Any]) -> list[str]:
    locks = [getattr(o, attr, None) for o in objects for attr in ("_rlock", "_wlock", "_sem")]
    return [lock._semlock.name for lock in locks if lock is not None and lock._semlock.name]


def test_the_queues_semaphore_names_are_gone_while_the_workers_run(small_tree: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], int]] = []
    real = pool.unlink_semaphores

    def spy(objects: list[Any]) -> int:
        names = _names(objects)
        seen.append((names, real(objects)))
        return seen[-1][1]

    monkeypatch.setattr(pool, "unlink_semaphores", spy)
    pack(str(small_tree), str(tmp_path / "out"), options=PackOptions(max_count=1), workers=2)
    assert len(seen) == 1, "the workers' queues were not unlinked while they ran"
    names, unlinked = seen[0]
    assert unlinked == len(names) == 8  # the pool's call and result queues, the progress queue
    assert not [n for n in names if os.path.exists("/dev/shm/sem." + n.lstrip("/"))]
