"""The contract between a route's worker half and everything that carries its batches.

:class:`~shardkit.loader.run.stream.BatchStream` (in the worker processes) and
:class:`~shardkit.loader.routes.base.Route` (in the loader's process) both depend on it; it depends on
nothing but the stage counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from shardkit.loader.stats import StageStats

__all__ = ["Builder", "WorkerBatch"]


class WorkerBatch(Protocol):
    """What every route's batch carries besides its data: sample keys and stage counters."""

    keys: list[str]
    stats: StageStats


W_co = TypeVar("W_co", bound=WorkerBatch, covariant=True)


class Builder(Protocol[W_co]):
    """A route's worker half: build one batch from its samples, in order (picklable)."""

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> W_co: ...
