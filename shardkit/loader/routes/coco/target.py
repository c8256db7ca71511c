"""One COCO sample's ``json`` member -> a target dict in torchvision detection-model convention.

What torchvision's ``wrap_dataset_for_transforms_v2(CocoDetection(...))`` computes, as tensors:
every annotation of the image in file order, crowd and degenerate boxes kept (filtering is the
transform's job: ``SanitizeBoundingBoxes`` in :func:`~shardkit.transforms.detection_train`);
boxes converted XYWH -> XYXY in float32 exactly as its ``convert_bounding_box_format`` does;
masks decoded with pycocotools exactly as its ``segmentation_to_mask`` does, on the decoded
image's size. Differences, on purpose: an image without annotations gets empty ``boxes``,
``labels``, ``area``, ``iscrowd`` (and ``masks``) rather than only ``image_id`` (detection models
need the keys); ``area`` and ``iscrowd`` are tensors rather than lists; a missing ``area`` is
the box's ``w * h``, a missing ``iscrowd`` is 0.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from shardkit.format.bounded import parse_json

__all__ = ["BadTarget", "coco_target", "contiguous_label_map", "segmentation_to_mask"]


class BadTarget(ValueError):
    """The ``json`` member cannot be turned into a target (the message says why)."""


def contiguous_label_map(categories: Any) -> dict[Any, int]:
    """Category id -> 1..K in ascending id order (0 is left for the background).

    Example:
        >>> contiguous_label_map([{"id": 90}, {"id": 1}, {"id": 18}])
        {1: 1, 18: 2, 90: 3}
    """
    ids = sorted({c["id"] for c in categories or ()}, key=lambda i: (isinstance(i, str), i))
    return {cid: k + 1 for k, cid in enumerate(ids)}


#: pycocotools' decode warning, ignored where pycocotools raises it, ahead of the filters set
#: before this module loads (``python -W error``): set once, as the module loads (a thread-safe
#: change of the filters, unlike catch_warnings beside other threads). A filter set later (pytest's
#: ``filterwarnings = error``, per test) comes first: off the main thread it turns the warning back
#: into an error there.
_QUIET_DECODE = "__array__ implementation doesn't accept a copy keyword"
warnings.filterwarnings("ignore", message=re.escape(_QUIET_DECODE), category=DeprecationWarning,
                        module=r"pycocotools\.mask")


def segmentation_to_mask(segmentation: Any, height: int, width: int) -> torch.Tensor:
    """A COCO ``segmentation`` (polygons, uncompressed or compressed RLE) -> uint8 ``[H, W]``."""
    from pycocotools import mask as mask_utils  # optional dependency: only when masks are asked for

    if isinstance(segmentation, dict):
        if not isinstance(segmentation.get("counts"), str):  # uncompressed RLE
            segmentation = mask_utils.frPyObjects(segmentation, height, width)
    elif isinstance(segmentation, list):
        segmentation = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    else:
        raise BadTarget(f"segmentation must be polygons or RLE, got {type(segmentation).__name__}")
    if threading.current_thread() is threading.main_thread():  # a worker's, or the loop's without workers
        # pycocotools' decode under numpy 2: a DeprecationWarning each call, which -W error (or a
        # test run's filterwarnings = error, set per test) made a bad sample of every mask. Not
        # in another thread (the COCO GPU route's without workers): catch_warnings swaps the
        # process's filters, which the loop's thread may be changing; _QUIET_DECODE serves there,
        # for filters set before this module loaded.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            decoded = mask_utils.decode(segmentation)
    else:
        decoded = mask_utils.decode(segmentation)
    plane = torch.from_numpy(np.ascontiguousarray(decoded))
    if tuple(plane.shape) != (height, width):
        raise BadTarget(f"RLE of size {list(plane.shape)} on an image of size {[height, width]}")
    return plane


def coco_target(meta: bytes | Mapping[str, Any], height: int, width: int, *, masks: bool = False,
                label_map: Mapping[Any, int] | None = None) -> dict[str, Any]:
    """Build ``{image_id, boxes, labels, area, iscrowd[, masks]}`` for one image.

    Args:
        meta: the sample's ``json`` member (bytes) or its parsed object
            ``{"image": {...}, "annotations": [...]}``.
        height, width: the decoded image's size (masks are decoded at this size).
        masks: also decode ``masks`` uint8 ``[N, H, W]`` (needs pycocotools).
        label_map: category id -> label; None keeps the ids.
    Returns:
        ``image_id`` (the record's id, int or str), ``boxes`` float32 ``[N, 4]`` XYXY pixels,
        ``labels`` int64 ``[N]``, ``area`` float32 ``[N]``, ``iscrowd`` int64 ``[N]``.
    Raises:
        BadTarget: not JSON, no image record, an annotation without a 4-number ``bbox``, a
            category missing from ``label_map``, a bad segmentation.
    """
    try:
        doc = parse_json(bytes(meta)) if isinstance(meta, (bytes, bytearray, memoryview)) else meta
        image_id = doc["image"]["id"]
        anns = list(doc.get("annotations") or ())
    except (ValueError, KeyError, TypeError) as err:
        raise BadTarget(f"json member is not a COCO sample ({err})") from err
    n = len(anns)
    rows: list[list[float]] = []
    cats: list[Any] = []
    areas: list[float] = []
    crowd: list[int] = []
    try:  # Python lists first, one tensor per field after: a tensor per annotation cost ~0.3 ms an image
        for ann in anns:
            bbox = [float(v) for v in ann["bbox"]]
            if len(bbox) != 4:
                raise BadTarget(f"annotation {ann.get('id')!r}: bbox must have 4 numbers, got {bbox}")
            rows.append(bbox)
            cid = ann["category_id"]
            cats.append(cid if label_map is None else label_map[cid])
            areas.append(float(ann["area"]) if "area" in ann else bbox[2] * bbox[3])
            crowd.append(int(ann.get("iscrowd", 0)))
        boxes = torch.tensor(rows, dtype=torch.float32).reshape(n, 4)
        labels = torch.tensor(cats, dtype=torch.int64)
        area = torch.tensor(areas, dtype=torch.float32)
        iscrowd = torch.tensor(crowd, dtype=torch.int64)
    except BadTarget:
        raise
    except KeyError as err:
        raise BadTarget(f"annotation {len(rows)}: missing {err} (or category not in the label map)") from err
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise BadTarget(f"annotation {len(rows)}: malformed ({err})") from err
    boxes[:, 2:] += boxes[:, :2]  # XYWH -> XYXY, the same float32 op as torchvision's
    target: dict[str, Any] = {"image_id": image_id, "boxes": boxes, "labels": labels, "area": area, "iscrowd": iscrowd}
    if masks:
        try:
            planes = [segmentation_to_mask(ann["segmentation"], height, width) for ann in anns]
        except KeyError as err:
            raise BadTarget("annotation without segmentation (masks=True)") from err
        except Exception as err:  # pycocotools: IndexError for no polygon, a bare Exception for a short one
            raise BadTarget(f"bad segmentation ({type(err).__name__}: {err})") from err
        target["masks"] = torch.stack(planes) if planes else torch.zeros((0, height, width), dtype=torch.uint8)
    return target
