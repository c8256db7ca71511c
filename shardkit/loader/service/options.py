"""What a loader's preprocessing service is: a Ray cluster's address and how to use it.

No Ray and no torch here: a :class:`RayService` is plain, checked data that a user builds in
the training script and hands to ``ShardLoader(service=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.errors import LoaderError

__all__ = ["RayService"]


def _positive(name: str, value: object, *, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise LoaderError(f"RayService {name} must be a positive {'int' if integer else 'number'}, got {value!r}")


@dataclass(frozen=True)
class RayService:
    """Build batches on the CPU nodes of a Ray cluster and stream them to this process
    (``ShardLoader(service=RayService(...))``; see docs/guides/service.md).

    The epoch plan, ranks, resume state and delivery order stay in the training process: it
    asks the service's workers (Ray actors, one CPU each) for batch ``i`` of an epoch by its
    samples and seeds, keeps at most ``in_flight`` batches asked for and not yet delivered, and
    delivers them in order, so a loader with a service yields the batches, order and
    augmentation of the same loader with local workers. A worker or node that dies mid-epoch
    has its outstanding batches built again by the others (and is replaced).

    Args:
        address: the cluster: ``"auto"`` (the cluster this node belongs to, as ``ray start``
            left it), ``"HOST:PORT"`` (the head node's GCS port, 6379 by default) or
            ``"ray://HOST:PORT"`` (Ray Client; batches are then copied over gRPC). Ignored when
            this process is already connected (``ray.init`` was called).
        workers: service workers (Ray actors) to run.
        in_flight: batches asked for and not yet delivered, at most (back-pressure: bounds the
            object-store memory the service fills); default ``2 * workers``.
        cpus_per_worker: CPUs Ray reserves for each worker.
        connect_timeout_s: seconds to reach the cluster's address before giving up.
        start_timeout_s: seconds for every worker to start (import shardkit, open the dataset)
            and for a replacement to start when none is left.
        batch_timeout_s: seconds one batch may take once it is the next one due; a worker that
            takes longer is counted as dead (its batches are built elsewhere).
        retries: times one batch may be lost to dying workers before the loader gives up.

    Raises:
        LoaderError: an argument out of range (naming it).

    Example::

        loader = ShardLoader("/data/train", batch_size=256, transform=transforms.imagenet_train(224),
                             device="cuda", service=RayService("10.0.0.5:6379", workers=32))
    """

    address: str = "auto"
    workers: int = 4
    in_flight: int | None = None
    cpus_per_worker: float = 1.0
    connect_timeout_s: float = 10.0
    start_timeout_s: float = 120.0
    batch_timeout_s: float = 300.0
    retries: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address.strip():
            raise LoaderError(f"RayService address must be 'auto', 'HOST:PORT' or 'ray://HOST:PORT', "
                              f"got {self.address!r}")
        _positive("workers", self.workers, integer=True)
        if self.in_flight is not None:
            _positive("in_flight", self.in_flight, integer=True)
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise LoaderError(f"RayService retries must be an int >= 0, got {self.retries!r}")
        for name in ("cpus_per_worker", "connect_timeout_s", "start_timeout_s", "batch_timeout_s"):
            _positive(name, getattr(self, name), integer=False)

    @property
    def window(self) -> int:
        """Batches in flight at most (``in_flight``, or two per worker)."""
        return self.in_flight if self.in_flight is not None else 2 * self.workers
