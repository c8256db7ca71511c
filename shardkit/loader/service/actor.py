"""A service worker: the CPU route's worker half, run as a Ray actor on a node of the cluster.

A plain class (the training process makes it a Ray actor with ``ray.remote``), built from the
loader's own :class:`~shardkit.loader.routes.cpu.worker.CpuBatchBuilder`: it reads only the
datasets that builder names, with the transform the loader was given. It holds no epoch, plan
or position: the training process asks for each batch by its samples and seeds
(:meth:`BatchActor.build`), so any worker builds any batch the same way, and a batch lost with
its worker is built again by another.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit._version import __version__
from shardkit.errors import ShardkitError
from shardkit.index.manifest_io import read_manifest
from shardkit.loader.routes.cpu.worker import CpuBatchBuilder
from shardkit.loader.service.payload import Failure, Payload, to_payload
from shardkit.storage import Store

__all__ = ["BatchActor", "DatasetCheck", "Started"]


@dataclass(frozen=True)
class DatasetCheck:
    """One dataset a worker must read as the training process does: its store, the fingerprint of
    its shards' hashes, and one of its shards (by joined index, -1: none) to open."""

    store: Store
    fingerprint: str
    shard: int


@dataclass(frozen=True)
class Started:
    """What a worker reports once started: where it runs, and what stops it from serving (None: nothing)."""

    node: str
    pid: int
    problem: str | None


class BatchActor:
    """Build CPU-route batches with ``builder`` for the training process (see the module doc).

    ``datasets``: checked by :meth:`start` (the node must read the same shards); ``version``: the
    training process's shardkit version, which this node's must equal (a batch is only the same
    batch when built by the same code).
    """

    def __init__(self, builder: CpuBatchBuilder, datasets: Sequence[DatasetCheck], version: str) -> None:
        self.builder = builder
        self.datasets = tuple(datasets)
        self.version = version

    def start(self) -> Started:
        """Where this worker runs and whether it can serve: same shardkit version, every dataset's
        ``index.json`` read with the training process's fingerprint, one shard of each opened."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return Started(node, os.getpid(), self.check())

    def check(self) -> str | None:
        """What stops this worker from serving (None: nothing): see :meth:`start`."""
        if self.version != __version__:
            return f"the node runs shardkit {__version__}, the training process {self.version}"
        for check in self.datasets:
            try:
                found = read_manifest(check.store, cache_dir=self._cache_dir()).table.fingerprint
                if found != check.fingerprint:
                    return (f"{check.store.url} holds other shards on this node than in the training process "
                            f"(fingerprint {found[:12]}, expected {check.fingerprint[:12]})")
                if check.shard >= 0:
                    self.builder.samples.reader.key(check.shard, 0)
            except ShardkitError as err:
                return f"cannot read the dataset here: {err}"
        return None

    def _cache_dir(self) -> str | None:
        cache = self.builder.samples.reader.cache
        return None if cache is None else str(cache.directory)

    def build(self, shards: Sequence[int], indices: Sequence[int], seeds: Sequence[int]) -> Payload | Failure:
        """One batch of the given samples, in order (a :class:`ShardkitError` comes back as a :class:`Failure`)."""
        try:
            return to_payload(self.builder.build(shards, indices, seeds))
        except ShardkitError as err:
            return Failure(type(err).__name__, err.message, err.where, traceback.format_exc())
