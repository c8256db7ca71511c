"""What ``shardkit doctor`` reports: one typed finding per check, with its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "note", "problem"]
"""``ok``: fine. ``note``: worth knowing, harmless for training (an optional backend missing, no
GPU on a CPU machine). ``problem``: breaks or slows training; ``shardkit doctor`` exits 1."""


@dataclass(frozen=True)
class Finding:
    """The result of one check.

    ``check`` names what was checked (``"torch"``, ``"/dev/shm"``); ``detail`` what was found;
    ``fix`` what to do about it (for notes and problems).

    Example::

        Finding("ulimit -n", "problem", "soft limit 256 < 1024", fix="ulimit -n 65536")
    """

    check: str
    status: Status
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class LoaderPlan:
    """The loader configuration to check the machine against (``--workers/--batch-size/--size``).

    ``prefetch`` is :class:`shardkit.ShardLoader`'s default (batches each worker prepares ahead).
    """

    workers: int
    batch_size: int
    size: int
    prefetch: int = 2

    @property
    def shm_bytes(self) -> int:
        """Shared memory the loader may hold: each worker keeps up to ``prefetch + 3`` uint8 batch
        segments of ``batch_size x 3 x size x size`` bytes (docs/guides/stream.md, "Memory")."""
        return self.workers * (self.prefetch + 3) * self.batch_size * 3 * self.size * self.size
