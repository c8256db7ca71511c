"""Routes: how a batch gets from its samples to the device.

Each route has a worker half (builds a batch in a worker process: ``worker.py``) and a host half
(delivers batches on the device in the training or feeder process: ``route.py``, ``host.py``).
:mod:`~shardkit.loader.routes.choose` picks one from a :class:`~shardkit.loader.routes.spec.RouteSpec`:
:mod:`~shardkit.loader.routes.cpu`, :mod:`~shardkit.loader.routes.gpu`,
:mod:`~shardkit.loader.routes.coco` or :mod:`~shardkit.loader.routes.coco_gpu`.
:mod:`~shardkit.loader.routes.base` is the contract every route keeps,
:mod:`~shardkit.loader.routes.batch` the worker half's, and :mod:`~shardkit.loader.routes.device`
the staging both GPU routes share (payload blob, pinned slots, decode stages, prefetch threads).

Routes never import :mod:`shardkit.loader.run` or :mod:`shardkit.loader.feed` (``make lint`` checks).
"""
