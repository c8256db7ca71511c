"""COCO detection datasets: an images folder plus an ``instances.json``, one sample per image.

Samples are the ``images`` records sorted by ``id`` (ints before strings), the order of
``torchvision.datasets.CocoDetection``, so with nothing dropped the sample with source index
``i`` (key ``i``) is ``CocoDetection(...)[i]``. Each sample's ``meta`` is
``{"image": <record>, "annotations": [<records of that image, in file order>]}``, the records
being the very objects read from the file (every field kept; nothing added).

Structural errors (malformed JSON, missing required keys) raise ``SourceError``. Data errors are
reported and packing goes on. Problems of images go into ``listing.warnings`` (``{source,
reason}``; they count as skipped inputs); problems of annotation records go into
``listing.annotation_problems`` (``{source, reason, annotations, dropped}``), never counted as
skipped images:

* annotations of unknown image ids or unknown categories: dropped, counted per kind;
* boxes outside the image (more than :data:`BOX_TOLERANCE` px) or malformed: kept, counted
  per image; categories repeating an id: kept (``annotations: 0``);
* image records repeating an image id, and ``file_name``s escaping the images folder: not
  packed (``warnings``);
* files missing on disk: kept with ``size=-1``; the packer skips them with a reason.

The images folder and the annotations file may each be an fsspec URL (``s3://…``); the images
are then looked up in one listing of the folder, not one request each.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
from collections import defaultdict
from typing import Any

from shardkit.errors import SourceError, StorageError
from shardkit.format.coco import segmentation_malformed
from shardkit.sources.base import SourceListing, SourceSample
from shardkit.sources.open import open_files
from shardkit.storage import Store, is_remote

#: How far (pixels) a box may overshoot the image before it is reported (COCO's own boxes
#: overshoot by float rounding).
BOX_TOLERANCE = 1.0
_EXAMPLES = 5


def _read(path: str, storage_options: dict[str, Any] | None) -> bytes:
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    parent, _, name = path.rpartition("/")
    if "://" not in parent or not name:
        raise SourceError("not the URL of a file", where=path)
    try:
        return Store(parent, storage_options).read_bytes(name)
    except StorageError as err:
        if isinstance(err.__cause__, FileNotFoundError):  # a missing bucket is named instead
            raise SourceError("annotations file does not exist", where=path) from err
        raise


def load_instances(path: str, storage_options: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """Read a COCO instances file (a path, or an fsspec URL read with ``storage_options``) and
    check its top level; raise ``SourceError`` naming it (``StorageError`` when a URL cannot be
    read: network, credentials, missing bucket).

    Returns the parsed document and the sha256 of the file's bytes.
    """
    try:
        raw = _read(path, storage_options)
        digest = hashlib.sha256(raw).hexdigest()
        doc = json.loads(raw)
    except FileNotFoundError as err:
        raise SourceError("annotations file does not exist", where=path) from err
    except json.JSONDecodeError as err:
        raise SourceError(f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
                          where=path) from err
    except UnicodeDecodeError as err:
        raise SourceError(f"not valid JSON (not UTF-8: {err.reason} at byte {err.start})",
                          where=path) from err
    except OSError as err:
        raise SourceError(f"cannot read annotations file: {err.strerror or err}",
                          where=path) from err
    if not isinstance(doc, dict):
        raise SourceError(f"top level must be a JSON object, not {type(doc).__name__}", where=path)
    for key in ("images", "annotations", "categories"):
        if key not in doc:
            raise SourceError(f'missing "{key}" (a COCO instances file has images, '
                              'annotations, categories)', where=path)
        if not isinstance(doc[key], list):
            raise SourceError(f'"{key}" must be a list, not {type(doc[key]).__name__}', where=path)
    if not doc["images"]:
        raise SourceError('"images" is empty: the file lists no image to pack', where=path)
    if not doc["categories"] and doc["annotations"]:
        raise SourceError(f'"categories" is empty, so each of the {len(doc["annotations"]):,} annotations names an '
                          "unknown category", where=path)
    return doc, digest


def _record(doc: dict[str, Any], section: str, i: int, keys: tuple[str, ...],
            path: str) -> dict[str, Any]:
    record = doc[section][i]
    if not isinstance(record, dict):
        raise SourceError(f"{section}[{i}]: must be an object, not {type(record).__name__}",
                          where=path)
    for key in keys:
        if key not in record:
            raise SourceError(f'{section}[{i}]: missing "{key}"', where=path)
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise SourceError(f'{section}[{i}]: "{key}" must be an integer or string, not '
                              f'{value!r}', where=path)
    return record


def _safe_rel(name: Any) -> bool:
    parts = name.replace("\\", "/").split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts and ":" not in parts[0]


def _unreadable(ann: dict[str, Any]) -> bool:
    """Whether the loader cannot read ``ann``'s box, area or crowd flag as numbers (it would then
    replace the whole image, every epoch): such an annotation is dropped when packed."""
    try:
        if len([float(v) for v in ann["bbox"]]) != 4:
            return True
        if "area" in ann:
            float(ann["area"])
        int(ann.get("iscrowd", 0))
    except (KeyError, TypeError, ValueError, OverflowError):
        return True
    return False


def _bbox_problem(box: Any, width: Any, height: Any) -> str | None:
    """``"malformed"`` (a negative width or height, a NaN), ``"outside"`` (by more than
    BOX_TOLERANCE) or None, for a box the loader reads (:func:`_unreadable` is not); hot loop, so EAFP."""
    try:
        x, y, w, h = (float(v) for v in box)
        if not (w >= 0 and h >= 0 and x == x and y == y):  # x == x: not NaN
            return "malformed"
        if not isinstance(width, (int, float)) or not isinstance(height, (int, float)):
            return None
        t = BOX_TOLERANCE
        if x < -t or y < -t or x + w > width + t or y + h > height + t:
            return "outside"
    except (TypeError, ValueError):
        return "malformed"
    return None


def _ids(values: list[Any]) -> str:
    more = f", … {len(values) - _EXAMPLES} more" if len(values) > _EXAMPLES else ""
    return ", ".join(map(str, values[:_EXAMPLES])) + more


#: The ``index.json`` field of a pack made with ``drop_empty``: ``{"images": <left out>}`` (docs/concepts/format.md).
DROP_EMPTY = "drop_empty"


def scan_coco(images_dir: str, annotations_json: str, *, drop_empty: bool = False,
              storage_options: dict[str, Any] | None = None) -> SourceListing:
    """List a COCO dataset: one sample per image record, with its annotation records.

    Args:
        images_dir: folder the records' ``file_name``s are relative to (a path or fsspec URL).
        annotations_json: the instances file (``images``, ``annotations``, ``categories``;
            ``info`` and ``licenses`` are carried into ``listing.extra`` when present); a path
            or fsspec URL.
        drop_empty: leave out images that have no (valid) annotation; how many is recorded in
            ``listing.extra["drop_empty"]`` (``{"images": n}``, carried into ``index.json``).
        storage_options: fsspec options for URLs (credentials, endpoint).

    Raises:
        SourceError: ``images_dir`` is not a directory; the file is missing or not JSON; a
            section, an image ``id``/``file_name``, an annotation ``id``/``image_id``/
            ``category_id`` or a category ``id`` is missing (the message names e.g.
            ``annotations[17]``).
        StorageError: a URL cannot be listed or read (missing bucket, network, credentials).

    Example::

        listing = scan_coco("coco/train2017", "coco/annotations/instances_train2017.json")
        listing.samples[0].meta["annotations"][0]["bbox"]
    """
    files = open_files(images_dir, storage_options)
    if not files.is_dir():
        raise SourceError("images directory does not exist or is not a directory", where=files.root)
    doc, digest = load_instances(annotations_json, storage_options)
    name = posixpath.basename(annotations_json)
    warnings: list[dict[str, str]] = []
    ann_problems: list[dict[str, Any]] = []

    categories = [_record(doc, "categories", i, ("id",), annotations_json)
                  for i in range(len(doc["categories"]))]
    category_ids = {c["id"] for c in categories}
    if len(category_ids) != len(categories):
        ann_problems.append({"source": name, "reason": f"{len(categories) - len(category_ids)} "
                                                       "categories repeat an id",
                         "annotations": 0, "dropped": False})

    images: dict[Any, dict[str, Any]] = {}
    refused: set[Any] = set()  # ids of image records not packed
    for i in range(len(doc["images"])):
        image = _record(doc, "images", i, ("id", "file_name"), annotations_json)
        sizes = [(side, image.get(side, 1)) for side in ("width", "height")]  # a file without them: as it is
        bad = next(((side, v) for side, v in sizes
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0), None)
        if bad is not None:
            warnings.append({"source": str(image["file_name"]),
                             "reason": f'images[{i}]: "{bad[0]}" must be a positive number of pixels, not '
                                       f"{bad[1]!r}; not packed"})
            with contextlib.suppress(TypeError):
                refused.add(image["id"])
        elif not isinstance(image["file_name"], str) or not _safe_rel(image["file_name"]):
            warnings.append({"source": str(image["file_name"]),
                             "reason": f"images[{i}]: file_name is not a path inside the images "
                                       "folder; not packed"})
            with contextlib.suppress(TypeError):  # an id that is no key is no image's either
                refused.add(image["id"])
        elif image["id"] in images:
            warnings.append({"source": image["file_name"],
                             "reason": f"images[{i}]: repeated image id (id {image['id']!r}: only the "
                                       "first record is packed)"})
        else:
            images[image["id"]] = image

    by_image: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    unknown_image: list[Any] = []
    of_refused: list[Any] = []
    unknown_category: dict[Any, list[Any]] = defaultdict(list)
    bad_boxes: dict[Any, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    unreadable: list[Any] = []
    for i, ann in enumerate(doc["annotations"]):
        try:  # fast path for the ~1M annotations of COCO train; _record explains any failure
            ann_id, image_id, category_id = ann["id"], ann["image_id"], ann["category_id"]
            owner = images.get(image_id)
            known_category = category_id in category_ids
        except (KeyError, TypeError, IndexError):
            _record(doc, "annotations", i, ("id", "image_id", "category_id"), annotations_json)
            raise
        if owner is None:
            (of_refused if image_id in refused else unknown_image).append(ann_id)
        elif not known_category:
            unknown_category[category_id].append(ann_id)
        elif _unreadable(ann):
            unreadable.append(ann_id)
        else:
            by_image[image_id].append(ann)
            problem = _bbox_problem(ann.get("bbox"), owner.get("width"), owner.get("height"))
            if problem:
                bad_boxes[image_id][problem].append(ann_id)
            if "segmentation" in ann and segmentation_malformed(ann["segmentation"], owner.get("width"),
                                                                owner.get("height")):
                bad_boxes[image_id]["segmentation"].append(ann_id)
    if unknown_image:
        ann_problems.append({"source": name,
                             "reason": f"{len(unknown_image)} annotation(s) reference unknown "
                                       f"image ids; dropped (annotation ids {_ids(unknown_image)})",
                             "annotations": len(unknown_image), "dropped": True})
    if of_refused:
        ann_problems.append({"source": name,
                             "reason": f"{len(of_refused)} annotation(s) belong to image records not packed "
                                       f"(skipped above); dropped (annotation ids {_ids(of_refused)})",
                             "annotations": len(of_refused), "dropped": True})
    if unreadable:
        ann_problems.append({"source": name,
                             "reason": f"{len(unreadable)} annotation(s) have a bbox that is not 4 numbers, or an "
                                       "area or iscrowd that is not a number; dropped (a loader would replace their "
                                       f"image) (annotation ids {_ids(unreadable)})",
                             "annotations": len(unreadable), "dropped": True})
    for cid, ann_ids in unknown_category.items():
        ann_problems.append({"source": name,
                             "reason": f"{len(ann_ids)} annotation(s) have unknown category_id "
                                       f"{cid!r}; dropped (annotation ids {_ids(ann_ids)})",
                             "annotations": len(ann_ids), "dropped": True})
    for image_id, problems in bad_boxes.items():
        image = images[image_id]
        for problem, ann_ids in sorted(problems.items()):
            what = {"outside": f"bbox(es) extend outside the {image.get('width')}x{image.get('height')} image",
                    "malformed": "bbox(es) have a negative width or height, or NaN (need [x, y, w, h], w, h >= 0)",
                    "segmentation": "segmentation(s) are malformed (need polygons whose first has more than 4 "
                                    "coordinates, or an RLE of the image's size), so a loader with masks=True "
                                    "replaces the image"}[problem]
            ann_problems.append({"source": image["file_name"],
                             "reason": f"{len(ann_ids)} annotation {what}; kept as is "
                                       f"(annotation ids {_ids(ann_ids)})",
                             "annotations": len(ann_ids), "dropped": False})

    kept = []
    for image_id in sorted(images, key=lambda k: (isinstance(k, str), k)):
        anns = by_image.get(image_id, [])
        if not (drop_empty and not anns):
            kept.append((images[image_id], anns))
    dropped = len(images) - len(kept)
    entries = files.stat([image["file_name"] for image, _ in kept])
    samples = [SourceSample(e.path, image["file_name"], e.size,
                            meta={"image": image, "annotations": anns}, version=e.version)
               for (image, anns), e in zip(kept, entries, strict=True)]
    if samples and all(sample.size < 0 for sample in samples):  # the wrong folder, not a few lost files
        raise SourceError(f"none of the {len(samples)} images {name} names is in this folder "
                          f"(e.g. {samples[0].rel!r}): give the folder that holds them", where=files.root)
    extra: dict[str, Any] = {k: doc[k] for k in ("info", "licenses") if k in doc}
    if drop_empty:
        extra[DROP_EMPTY] = {"images": dropped}
    return SourceListing(kind="coco", root=files.root, samples=samples, categories=categories,
                         extra=extra, warnings=warnings, annotation_problems=ann_problems,
                         meta_digest=f"{digest}:drop_empty={drop_empty}", files=files)
