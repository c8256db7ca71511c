"""Streaming packed shards into PyTorch: epoch plan, shard reading, routes, prefetch.

Layout (dependencies point one way, downwards):

- :mod:`~shardkit.loader.loader`: :class:`ShardLoader`, the epoch, its position and state
  (:mod:`~shardkit.loader.arguments`: its arguments checked; :mod:`~shardkit.loader.habits`:
  other libraries' arguments taken or refused);
- :mod:`~shardkit.loader.feed.pool`: the route's host half in processes of its own (``feeders``),
  handing batches over through shared device memory (:mod:`~shardkit.loader.feed.process`: a
  feeder's side);
- :mod:`~shardkit.loader.service`: the CPU route's workers as Ray actors on other nodes
  (``service=``), streaming batches to the training process;
- :mod:`~shardkit.loader.routes.choose` chooses one :class:`~shardkit.loader.routes.base.Route`:
  :mod:`~shardkit.loader.routes.cpu`, :mod:`~shardkit.loader.routes.gpu` or :mod:`~shardkit.loader.routes.coco`,
  each a worker half (builds batches) and a host half (delivers them);
- shared by every route: :mod:`~shardkit.loader.routes.batch` (the worker half's contract),
  :mod:`~shardkit.loader.run.stream` (one worker's batches of an epoch),
  :mod:`~shardkit.loader.epochs.plan` and :mod:`~shardkit.loader.epochs.state` (the epoch plan and resume),
  :mod:`~shardkit.loader.epochs.mix` and :mod:`~shardkit.loader.read.datasets` (several datasets mixed),
  :mod:`~shardkit.loader.read.samples` and :mod:`~shardkit.loader.read.bad_samples` (reading samples,
  the bad-sample policy), :mod:`~shardkit.loader.read.reader` and :mod:`~shardkit.loader.read.cache`
  (shard files, local or cached), :mod:`~shardkit.loader.run.workers` and
  :mod:`~shardkit.loader.run.deaths` (worker processes, and naming the one that died),
  :mod:`~shardkit.loader.stats`.
"""

from shardkit.loader.loader import ShardLoader
from shardkit.loader.routes.device.options import GpuOptions
from shardkit.loader.service import RayService
from shardkit.loader.stats import StageStats

__all__ = ["GpuOptions", "RayService", "ShardLoader", "StageStats"]
