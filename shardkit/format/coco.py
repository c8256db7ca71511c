"""What a COCO annotation must hold for the loader to build its target: shape checks shared by
the pack (which reports what does not) and ``shardkit verify``."""

from __future__ import annotations

from typing import Any

__all__ = ["bbox_malformed", "segmentation_malformed"]


def bbox_malformed(bbox: Any) -> bool:
    """Whether ``bbox`` is not 4 numbers (numbers in text too: the loader reads them with
    ``float``), with which the loader cannot build the image's target.

    >>> bbox_malformed([1, 2, 3, 4]), bbox_malformed(["1", "2", "3", "4"]), bbox_malformed([1, 2, 3])
    (False, False, True)
    >>> bbox_malformed(None), bbox_malformed("1 2 3 4")
    (True, True)
    """
    try:
        return len([float(v) for v in bbox]) != 4
    except (TypeError, ValueError):
        return True


def segmentation_malformed(seg: Any, width: Any, height: Any) -> bool:
    """Whether a loader with ``masks=True`` cannot make a mask of ``seg``: polygons as pycocotools
    reads them (a list whose first polygon has more than 4 coordinates: 4 are taken for a box,
    fewer refused) or an RLE (``counts`` and a ``size`` of the image's ``[height, width]``, where
    those are known); by shape only (a hot loop: COCO train has ~860k annotations).

    >>> segmentation_malformed([[0, 0, 4, 0, 4, 4]], 8, 8), segmentation_malformed("x", 8, 8)
    (False, True)
    >>> segmentation_malformed([[0, 0, 4, 0, 4, 4], [1, 2]], 8, 8), segmentation_malformed([[0, 0, 2, 2]], 8, 8)
    (False, True)
    >>> rle = {"size": [8, 8], "counts": "abc"}
    >>> segmentation_malformed(rle, 8, 8), segmentation_malformed(rle, 16, 16)
    (False, True)
    """
    if isinstance(seg, list):
        return not seg or not isinstance(seg[0], list) or len(seg[0]) <= 4 or not all(isinstance(p, list) for p in seg)
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        if not isinstance(counts, (str, list)) or not isinstance(size, list) or len(size) != 2:
            return True
        return isinstance(width, int) and isinstance(height, int) and size != [height, width]
    return True
