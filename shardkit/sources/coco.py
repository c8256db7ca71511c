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
  per image; categories repeating an id, or without a ``name``: kept (``annotations: 0``);
* annotation records sharing an id: each kept as written, in its own image's sample, and
  flagged: ``CocoDetection`` (pycocotools keys annotations by id) gives the last record of the
  id in the place of each;
* image records repeating an image id: the last one stands for the id, as pycocotools
  (``imgs[id] = img``) and so ``CocoDetection`` keep it (packed unless refused on its own); the
  earlier ones are not packed (``warnings``), nor are ``file_name`` values escaping the images
  folder;
* files missing on disk: kept with ``size=-1``; the packer skips them with a reason.

The size checks take an image's size from its record; the pack reads each image's size from its
header and, where the record says another, flags it and makes that image's checks again at the
image's size (:func:`with_image_sizes`), the size the loader takes, as torchvision's
``CocoDetection`` wrapped for transforms v2 does.

The images folder and the annotations file may each be an fsspec URL (``s3://…``); the images
are then looked up in one listing of the folder, not one request each.
"""

from __future__ import annotations

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
            what = "a string (a path inside the images folder)" if key == "file_name" else "an integer or string"
            raise SourceError(f'{section}[{i}]: "{key}" must be {what}, not {value!r}', where=path)
    return record


def _safe_rel(name: Any) -> bool:
    parts = name.replace("\\", "/").split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts and ":" not in parts[0]


def _unreadable(ann: dict[str, Any]) -> bool:
    """Whether the loader cannot read ``ann``'s box, area or crowd flag as numbers (it would then
    replace the whole image, every epoch): such an annotation is dropped when packed."""
    numbers = (int, float)  # JSON's: a string of digits ("3") is not one, though float() would take it
    try:
        box = ann["bbox"]
        if len(box) != 4 or not all(type(v) in numbers for v in box):
            return True
        if "area" in ann and type(ann["area"]) not in numbers:
            return True
        crowd = ann.get("iscrowd", 0)
        if type(crowd) not in (int, float, bool):
            return True
        int(crowd)
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


def _annotation_problems(ann: dict[str, Any], width: Any, height: Any) -> tuple[str, ...]:
    """What is flagged of ``ann`` (kept: the loader reads it) on an image of ``width`` x ``height``
    (either may be missing: no check that needs it): ``"outside"``, ``"malformed"`` (its box),
    ``"segmentation"``."""
    problem = _bbox_problem(ann.get("bbox"), width, height)
    if "segmentation" in ann and segmentation_malformed(ann["segmentation"], width, height):
        return ("segmentation",) if problem is None else (problem, "segmentation")
    return () if problem is None else (problem,)


def _image_flags(image: dict[str, Any], problems: dict[str, list[Any]], width: Any,
                 height: Any) -> list[dict[str, Any]]:
    """The ``annotation_problems`` entries of one image: ``problems`` (kind -> annotation ids, as
    :func:`_annotation_problems` names them) found on an image of ``width`` x ``height``."""
    flags = []
    for problem, ann_ids in sorted(problems.items()):
        if not ann_ids:
            continue
        what = {"outside": f"bbox(es) extend outside the {width}x{height} image",
                "malformed": "bbox(es) have a negative width or height, or NaN (need [x, y, w, h], w, h >= 0)",
                "segmentation": "segmentation(s) are malformed (need polygons whose first has more than 4 "
                                "coordinates, or an RLE of the image's size), so a loader with masks=True "
                                "replaces the image"}[problem]
        flags.append({"source": image["file_name"],
                      "reason": f"{len(ann_ids)} annotation {what}; kept as is (annotation ids {_ids(ann_ids)})",
                      "annotations": len(ann_ids), "dropped": False})
    return flags


def _flags_at(image: dict[str, Any], anns: list[dict[str, Any]], width: Any, height: Any) -> list[dict[str, Any]]:
    problems: dict[str, list[Any]] = defaultdict(list)
    for ann in anns:
        for problem in _annotation_problems(ann, width, height):
            problems[problem].append(ann["id"])
    return _image_flags(image, problems, width, height)


def size_flag(image: dict[str, Any], width: int, height: int) -> dict[str, Any] | None:
    """The ``annotation_problems`` entry of an image record whose ``width``/``height`` differ from
    the image's (``width`` x ``height``, as decoded), or None: they agree, or the record gives none."""
    said = image.get("width"), image.get("height")
    if None in said or said == (width, height):
        return None
    return {"source": image["file_name"],
            "reason": f"the record of image id {image['id']!r} says {said[0]}x{said[1]}, the image is "
                      f"{width}x{height}; packed as is: the loader takes the image's size (masks are made at "
                      f"{width}x{height}, as torchvision's CocoDetection wrapped for transforms v2 makes them; "
                      "pycocotools' annToMask would take the record's), and its annotations are checked "
                      "against it",
            "annotations": 0, "dropped": False}


def with_image_sizes(problems: list[dict[str, Any]], samples: list[SourceSample],
                     sizes: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """``problems`` (a COCO listing's ``annotation_problems``, whose box and segmentation checks
    took each image's size from its record) with the images whose real size differs made right:
    ``sizes`` maps the index of such a sample in ``samples`` to its image's ``(width, height)``,
    as the pack found it. Each such image's flags are made again at that size, after a
    :func:`size_flag` saying how the record differs, in the place of its old ones (at the end when
    it had none); the rest is kept as it is.

    >>> image = {"id": 1, "file_name": "a.jpg", "width": 20, "height": 20}
    >>> ann = {"id": 7, "bbox": [0, 0, 50, 50]}
    >>> old = _flags_at(image, [ann], 20, 20)
    >>> [p["reason"].split(";")[0] for p in old]
    ['1 annotation bbox(es) extend outside the 20x20 image']
    >>> sample = SourceSample("a.jpg", "a.jpg", 1, meta={"image": image, "annotations": [ann]})
    >>> [p["reason"].split(";")[0] for p in with_image_sizes(old, [sample], {0: (79, 83)})]
    ['the record of image id 1 says 20x20, the image is 79x83']
    """
    if not sizes:
        return list(problems)
    slots: dict[tuple[str, str], list[int]] = defaultdict(list)
    for pos, p in enumerate(problems):
        slots[(str(p["source"]), str(p["reason"]))].append(pos)
    placed: dict[int, list[dict[str, Any]]] = {}
    gone: set[int] = set()
    tail: list[dict[str, Any]] = []
    for index in sorted(sizes):
        meta = samples[index].meta or {}
        image, anns = meta["image"], meta["annotations"]
        width, height = sizes[index]
        old = _flags_at(image, anns, image.get("width"), image.get("height"))
        new = [p for p in (size_flag(image, width, height),) if p is not None]
        new += _flags_at(image, anns, width, height)
        at = [slots[(str(p["source"]), p["reason"])].pop(0) for p in old
              if slots.get((str(p["source"]), p["reason"]))]
        if at:
            gone.update(at)
            placed[min(at)] = new
        else:
            tail += new
    out: list[dict[str, Any]] = []
    for pos, p in enumerate(problems):
        if pos in placed:
            out += placed[pos]
        elif pos not in gone:
            out.append(p)
    return out + tail


def _categories(n: int, one: str = "", more: str = "") -> str:
    """``n`` categories, then the verb that agrees (``one`` or ``more``), if any.

    >>> _categories(1, "repeats", "repeat"), _categories(2, "repeats", "repeat"), _categories(1)
    ('1 category repeats', '2 categories repeat', '1 category')
    """
    return f"{n} {'category' if n == 1 else 'categories'} {one if n == 1 else more}".rstrip()


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
        seen_ids: set[Any] = set()
        repeats: list[Any] = []
        for c in categories:
            if c["id"] in seen_ids:
                repeats.append(c["id"])
            seen_ids.add(c["id"])
        ann_problems.append({"source": name,
                             "reason": f"{_categories(len(repeats), 'repeats', 'repeat')} an id; kept as "
                                       f"{_categories(len(category_ids))}, each named by the last record of its id, "
                                       f"as pycocotools keeps it (category ids {_ids(list(dict.fromkeys(repeats)))})",
                             "annotations": 0, "dropped": False})
    unnamed = [c["id"] for c in categories if "name" not in c]
    if unnamed:
        ann_problems.append({"source": name,
                             "reason": f"{_categories(len(unnamed), 'has', 'have')} no \"name\"; the loader's classes "
                                       f"use the id as the name (category ids {_ids(unnamed)})",
                             "annotations": 0, "dropped": False})

    images: dict[Any, dict[str, Any]] = {}
    refused: set[Any] = set()  # ids of image records not packed
    records = [_record(doc, "images", i, ("id", "file_name"), annotations_json) for i in range(len(doc["images"]))]
    # pycocotools' imgs[id] = img: the last one stands for an id
    last = {image["id"]: i for i, image in enumerate(records)}  # ints or strings (_record)
    # ids are integers (COCO's) or strings (_record); a mix of both cannot be put in order
    # (CocoDetection and COCO's evaluation sort them, and fail on it): the fewer kind is not packed
    numbers = sum(type(image["id"]) is int for image in records)
    kind = int if 2 * numbers >= len(records) else str
    most = f"integers: {numbers:,}" if kind is int else f"strings: {len(records) - numbers:,}"
    for i, image in enumerate(records):
        if type(image["id"]) is not kind:
            warnings.append({"source": str(image["file_name"]),
                             "reason": f"images[{i}]: id {image['id']!r} is of another kind than most of the "
                                       f"file's image ids ({most} of {len(records):,}), and a mix cannot be put in "
                                       "order; not packed"})
            refused.add(image["id"])  # an int or a string (_record): a key
            continue
        if last[image["id"]] != i:
            warnings.append({"source": str(image["file_name"]),
                             "reason": f"images[{i}]: repeated image id (id {image['id']!r}: its last record, "
                                       f"images[{last[image['id']]}], stands for it, as pycocotools and so "
                                       "CocoDetection keep the last)"})
            continue
        sizes = [(side, image.get(side, 1)) for side in ("width", "height")]  # a file without them: as it is
        bad = next(((side, v) for side, v in sizes
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0), None)
        if bad is not None:
            warnings.append({"source": str(image["file_name"]),
                             "reason": f'images[{i}]: "{bad[0]}" must be a positive number of pixels, not '
                                       f"{bad[1]!r}; not packed"})
            refused.add(image["id"])
        elif not isinstance(image["file_name"], str) or not _safe_rel(image["file_name"]):
            warnings.append({"source": str(image["file_name"]),
                             "reason": f"images[{i}]: file_name is not a path inside the images "
                                       "folder; not packed"})
            refused.add(image["id"])
        else:
            images[image["id"]] = image

    by_image: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    unknown_image: list[Any] = []
    of_refused: list[Any] = []
    unknown_category: dict[Any, list[Any]] = defaultdict(list)
    bad_boxes: dict[Any, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    unreadable: list[Any] = []
    seen_ann_ids: set[Any] = set()
    shared: dict[Any, None] = {}  # annotation ids more than one record has, in file order
    for i, ann in enumerate(doc["annotations"]):
        try:  # fast path for the ~1M annotations of COCO train; _record explains any failure
            ann_id, image_id, category_id = ann["id"], ann["image_id"], ann["category_id"]
            owner = images.get(image_id)
            known_category = category_id in category_ids
            if ann_id in seen_ann_ids:
                shared[ann_id] = None
            else:
                seen_ann_ids.add(ann_id)
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
            for problem in _annotation_problems(ann, owner.get("width"), owner.get("height")):
                bad_boxes[image_id][problem].append(ann_id)
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
    if shared:
        kept_shared = [a["id"] for anns in by_image.values() for a in anns if a["id"] in shared]
        if kept_shared:
            ann_problems.append({"source": name,
                                 "reason": f"{len(kept_shared)} annotation(s) share their id with another record; "
                                           "kept as written, each record once in its own image's sample, where "
                                           "CocoDetection (pycocotools keys annotations by id) gives the last "
                                           "record of an id once per record of it "
                                           f"(annotation ids {_ids(list(dict.fromkeys(kept_shared)))})",
                                 "annotations": len(kept_shared), "dropped": False})
    for image_id, problems in bad_boxes.items():
        image = images[image_id]
        ann_problems += _image_flags(image, problems, image.get("width"), image.get("height"))

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
