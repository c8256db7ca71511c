"""Photo-like uint8 test images for the transform tests."""

from __future__ import annotations

import numpy as np
import torch


def make_photo(h: int, w: int, seed: int = 0, hwc: bool = True) -> torch.Tensor:
    """uint8 [3, h, w]: smooth colour field plus noise; HWC memory like decode_rgb's output."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([128 + 100 * np.sin(x / 11 + c) * np.cos(y / 17 - c) for c in range(3)], -1)
    arr = np.clip(a + rng.normal(0, 12, a.shape), 0, 255).astype(np.uint8)
    t = torch.from_numpy(arr).permute(2, 0, 1)
    return t if hwc else t.contiguous()
