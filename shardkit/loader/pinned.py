"""A ring slot of pinned host buffers for one in-flight batch, and its reuse guard.

Why reuse is safe: every host-to-device copy out of a slot is enqueued on the prefetch stream
before the slot's event is recorded on that stream, and :meth:`PinnedSlot.stage` first waits for
that event (in steady state it completed long ago, so the wait is free). A slot is therefore never
overwritten while a copy may still read it.
"""

from __future__ import annotations

import torch

__all__ = ["PinnedSlot", "chw_offsets"]


def chw_offsets(geometry: torch.Tensor) -> torch.Tensor:
    """int64 start of each image in a flat buffer of CHW images ``3 * height * width`` long."""
    sizes = 3 * geometry[:, 0].long() * geometry[:, 1].long()
    return torch.cumsum(sizes, 0) - sizes


class PinnedSlot:
    """Pinned staging buffers sized for ``batch_size`` images of ``size``, plus a CUDA event."""

    def __init__(self, batch_size: int, size: tuple[int, int], ncol: int, pin: bool) -> None:
        self.geometry = torch.empty((batch_size, ncol), dtype=torch.int32, pin_memory=pin)
        self.offsets = torch.empty(batch_size, dtype=torch.int64, pin_memory=pin)
        self.labels = torch.empty(batch_size, dtype=torch.int64, pin_memory=pin)
        self.cpu_dest = torch.empty(batch_size, dtype=torch.int64, pin_memory=pin)
        self.cpu_images = torch.empty((batch_size, 3, *size), dtype=torch.uint8, pin_memory=pin)
        self.event: torch.cuda.Event | None = None

    def stage(self, raw: object, labels: torch.Tensor, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copy a batch's small tensors in and start their async copies to ``device``.

        Returns device tensors: geometry, offsets, CPU-decoded images, their rows, labels.
        """
        if self.event is not None:
            self.event.synchronize()
        k, m, n = raw.geometry.shape[0], raw.cpu_dest.shape[0], labels.shape[0]  # type: ignore[attr-defined]
        if n > self.labels.shape[0]:
            raise ValueError(f"batch of {n} does not fit a slot of {self.labels.shape[0]}")
        self.geometry[:k].copy_(raw.geometry)  # type: ignore[attr-defined]
        self.offsets[:k].copy_(chw_offsets(raw.geometry))  # type: ignore[attr-defined]
        self.labels[:n].copy_(labels)
        self.cpu_dest[:m].copy_(raw.cpu_dest)  # type: ignore[attr-defined]
        self.cpu_images[:m].copy_(raw.cpu_images)  # type: ignore[attr-defined]
        return tuple(t.to(device, non_blocking=True) for t in (  # type: ignore[return-value]
            self.geometry[:k], self.offsets[:k], self.cpu_images[:m], self.cpu_dest[:m], self.labels[:n]))

    def release(self, stream: torch.cuda.Stream) -> None:
        """Record, on ``stream``, that every copy out of this slot has been enqueued."""
        self.event = torch.cuda.Event()
        self.event.record(stream)
