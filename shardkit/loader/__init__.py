"""Streaming packed shards into PyTorch: epoch plan, shard reading, routes, prefetch.

Layout (dependencies point one way, downwards):

- :mod:`~shardkit.loader.loader`: :class:`ShardLoader`, the epoch, its position and state
  (:mod:`~shardkit.loader.arguments`: its arguments checked);
- :mod:`~shardkit.loader.feeders`: the route's host half in processes of its own (``feeders``),
  handing batches over through shared device memory (:mod:`~shardkit.loader.feeder_process`: a
  feeder's side);
- :mod:`~shardkit.loader.routing` chooses one :class:`~shardkit.loader.route.Route`:
  :mod:`~shardkit.loader.cpu`, :mod:`~shardkit.loader.gpu` or :mod:`~shardkit.loader.coco`,
  each a worker half (builds batches) and a host half (delivers them);
- shared by every route: :mod:`~shardkit.loader.worker_batch` (the worker half's contract),
  :mod:`~shardkit.loader.stream` (one worker's batches of an epoch),
  :mod:`~shardkit.loader.plan` and :mod:`~shardkit.loader.state` (the epoch plan and resume),
  :mod:`~shardkit.loader.mix` and :mod:`~shardkit.loader.datasets` (several datasets mixed),
  :mod:`~shardkit.loader.samples` and :mod:`~shardkit.loader.bad_samples` (reading samples,
  the bad-sample policy), :mod:`~shardkit.loader.reader` and :mod:`~shardkit.loader.cache`
  (shard files, local or cached), :mod:`~shardkit.loader.workers` and
  :mod:`~shardkit.loader.deaths` (worker processes, and naming the one that died),
  :mod:`~shardkit.loader.stats`.
"""

from shardkit.loader.gpu.options import GpuOptions
from shardkit.loader.loader import ShardLoader
from shardkit.loader.stats import StageStats

__all__ = ["GpuOptions", "ShardLoader", "StageStats"]
