"""A transform slow enough that a service worker killed mid-epoch still owes batches."""

from __future__ import annotations

import time

import torch


class SlowCrop:
    """The top-left ``size`` x ``size`` pixels of an image, after ``delay_s`` of work."""

    def __init__(self, size: int = 16, delay_s: float = 0.03) -> None:
        self.size, self.delay_s = size, delay_s

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return image[:, : self.size, : self.size].clone()
