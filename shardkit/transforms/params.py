"""The per-image augmentation parameters shared by the CPU and GPU paths: a crop box and a flip."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CropFlip"]


class CropFlip(NamedTuple):
    """A crop box in source pixels and whether to mirror the result horizontally.

    The box is ``rows [top, top + height)`` and ``columns [left, left + width)`` of the decoded
    image; transforms resize only this box to their output size, then flip. Sampled on CPU
    workers, so the GPU path can crop before (or while) decoding. A named tuple, not a frozen
    dataclass: a worker makes one per image, and a frozen dataclass's ``__init__`` (an
    ``object.__setattr__`` per field) takes two and a half times as long.

    Example:
        >>> CropFlip(top=10, left=0, height=200, width=300, flip=True).width
        300
    """

    top: int
    left: int
    height: int
    width: int
    flip: bool = False

    def inside(self, height: int, width: int) -> bool:
        """True when the box is non-empty and lies within a ``height x width`` image."""
        return (
            self.height > 0
            and self.width > 0
            and self.top >= 0
            and self.left >= 0
            and self.top + self.height <= height
            and self.left + self.width <= width
        )
