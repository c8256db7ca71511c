"""What a route is chosen and built from, in one frozen object.

The loader builds one :class:`RouteSpec` from its arguments and hands it to
:func:`~shardkit.loader.routes.choose.choose_route`; a feeder process gets the same object (with
its own share of the workers, :meth:`RouteSpec.with_workers`) and chooses the same route, so the
options a route depends on travel one way only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.routes.device.options import GpuOptions
from shardkit.transforms.base import ImageTransform

__all__ = ["RouteSpec"]


@dataclass(frozen=True)
class RouteSpec:
    """The options a route depends on.

    ``transform``: an :class:`~shardkit.transforms.base.ImageTransform`, a detection transform, any
    callable on one decoded image, or None. ``device``: where batches are asked for (the route may
    deliver elsewhere: :attr:`~shardkit.loader.routes.base.Route.device` says where they end up).
    ``num_workers``: the worker processes this route's host half reads from (in a feeder, the
    feeder's own). ``masks``, ``pad``, ``contiguous_labels``: COCO only. ``captions``: captioned
    datasets only. ``service``: a preprocessing service builds the batches (the CPU route only).

    Example:
        >>> spec = RouteSpec(None, torch.device("cpu"), batch_size=32)
        >>> spec.with_workers(2).num_workers, spec.num_workers
        (2, 0)
    """

    transform: ImageTransform | Callable[..., Any] | None
    device: torch.device
    batch_size: int
    on_error: str = "replace"
    num_workers: int = 0
    prefetch: int = 2
    gpu: GpuOptions = field(default_factory=GpuOptions)
    masks: bool = False
    pad: bool | int = False
    contiguous_labels: bool = False
    #: Captioned datasets only: the text side of each batch (fields, text transform).
    captions: CaptionTargets | None = None
    #: Batches are built by a preprocessing service: the CPU route, whatever the device.
    service: bool = False

    def with_workers(self, num_workers: int) -> RouteSpec:
        """This spec for a route reading from ``num_workers`` workers (a feeder's share)."""
        return replace(self, num_workers=num_workers)

    def on(self, device: torch.device) -> RouteSpec:
        """This spec with batches asked for on ``device`` (where a fallback delivers them)."""
        return replace(self, device=device)
