"""The preprocessing service: a loader's workers run as Ray actors on other nodes and stream
ready batches to the training process (``ShardLoader(service=RayService(...))``).

- :mod:`~shardkit.loader.service.options`: :class:`RayService`, what the user passes (no Ray, no torch);
- :mod:`~shardkit.loader.service.client`: the training process's side: workers started, batches
  asked for in a bounded window and delivered in order, lost workers' batches built again;
- :mod:`~shardkit.loader.service.actor`: a worker's side (the CPU route's worker half as a Ray actor);
- :mod:`~shardkit.loader.service.payload`: a batch on the wire (numpy arrays, zero-copy in Ray's store);
- :mod:`~shardkit.loader.service.connect`: reaching the cluster within a time limit;
- :mod:`shardkit.serve` (outside the loader, no torch): the ``ray start`` command of a service node
  (``shardkit serve``).

Ray is imported only when a loader with a service is built.
"""

from shardkit.loader.service.options import RayService

__all__ = ["RayService"]
