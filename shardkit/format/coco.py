"""What a COCO annotation must hold for the loader to build its target: shape checks shared by
the pack (which reports what does not) and ``shardkit verify``."""

from __future__ import annotations

from typing import Any

__all__ = ["bbox_malformed", "segmentation_malformed"]


def bbox_malformed(bbox: Any) -> bool:
    """Whether ``bbox`` is not 4 numbers, with which the loader cannot build the image's target.

    >>> bbox_malformed([1, 2, 3, 4]), bbox_malformed([1, 2, 3]), bbox_malformed("1 2 3 4")
    (False, True, True)
    """
    return (not isinstance(bbox, list) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox))


def segmentation_malformed(seg: Any, width: Any, height: Any) -> bool:
    """Whether ``seg`` is neither polygons (lists of more than 4 coordinates) nor an RLE (``counts``
    and a ``size`` of the image's ``[height, width]``, where those are known), as a loader with
    ``masks=True`` decodes them; by shape only (a hot loop: COCO train has ~860k annotations).

    >>> segmentation_malformed([[0, 0, 4, 0, 4, 4]], 8, 8), segmentation_malformed("x", 8, 8)
    (False, True)
    >>> rle = {"size": [8, 8], "counts": "abc"}
    >>> segmentation_malformed(rle, 8, 8), segmentation_malformed(rle, 16, 16)
    (False, True)
    """
    if isinstance(seg, list):  # pycocotools reads a list of 4 numbers as a box, and fails on none
        return not seg or not all(isinstance(p, list) and len(p) > 4 for p in seg)
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        if not isinstance(counts, (str, list)) or not isinstance(size, list) or len(size) != 2:
            return True
        return isinstance(width, int) and isinstance(height, int) and size != [height, width]
    return True
