"""The COCO annotation report of a pack: annotations packed, dropped, and why (``index.json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.sources.base import SourceListing
from shardkit.sources.coco import with_image_sizes

#: The ``index.json`` field holding :func:`annotation_report` (COCO packs only).
ANNOTATION_REPORT = "annotation_report"


def annotation_report(listing: SourceListing, skipped: Sequence[dict[str, str]],
                      sizes: Mapping[int, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Count the annotations of a COCO pack apart from its images; ``skipped``: the samples of
    ``listing`` the writers skipped (by ``source``), not the records the scan refused; ``sizes``:
    ``(width, height)`` of the images packed whose record says another size, by sample index
    (their annotations are flagged at their size, and the record's said: see
    :func:`shardkit.sources.coco.with_image_sizes`).

    Returns ``{"packed", "dropped", "kept_with_problems", "in_skipped_images", "problems"}``:
    annotations written into samples; dropped by the source scan (unknown image or category);
    kept although flagged (boxes outside the image or malformed); lost with images the packer
    skipped; and the source's ``annotation_problems`` entries (``{source, reason, annotations,
    dropped}``).

    >>> from shardkit.sources.base import SourceSample
    >>> anns = {"image": {}, "annotations": [{"id": 1}, {"id": 2}]}
    >>> listing = SourceListing("coco", "img", [SourceSample("img/a.jpg", "a.jpg", 9, meta=anns)],
    ...     annotation_problems=[{"source": "i.json", "reason": "r", "annotations": 3,
    ...                           "dropped": True}])
    >>> {k: v for k, v in annotation_report(listing, []).items() if k != "problems"}
    {'packed': 2, 'dropped': 3, 'kept_with_problems': 0, 'in_skipped_images': 0}
    """
    lost = {s["source"] for s in skipped}
    packed = in_skipped = 0
    for sample in listing.samples:
        n = len(sample.meta.get("annotations", ())) if sample.meta else 0
        if sample.rel in lost:
            in_skipped += n
        else:
            packed += n
    problems = with_image_sizes(listing.annotation_problems, listing.samples, dict(sizes or {}))
    return {
        "packed": packed,
        "dropped": sum(p["annotations"] for p in problems if p["dropped"]),
        "kept_with_problems": sum(p["annotations"] for p in problems if not p["dropped"]),
        "in_skipped_images": in_skipped,
        "problems": list(problems),
    }
