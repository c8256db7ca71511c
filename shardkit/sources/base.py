"""What a source yields: an ordered list of samples to pack, plus dataset-level metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SourceSample:
    """One input sample: an image file and what goes beside it in the shard.

    ``rel`` is the path relative to the source root with POSIX separators (recorded as
    ``source``); ``size`` the file size in bytes (-1 when it cannot be stat'ed, e.g. a dangling
    link); ``label`` the class index (ImageFolder) and ``meta`` extra JSON fields (COCO records).
    """

    path: str
    rel: str
    size: int
    label: int | None = None
    meta: dict[str, Any] | None = None
    mtime_ns: int = 0


@dataclass(frozen=True)
class SourceListing:
    """All samples of a source in their canonical order, and dataset-level fields."""

    kind: str
    root: str
    samples: list[SourceSample]
    classes: list[str] | None = None
    categories: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[dict[str, str]] = field(default_factory=list)
    #: A digest standing for every sample's ``meta`` (e.g. the annotation file's sha256), so
    #: the pack fingerprint need not re-serialise per-sample metadata; ``None``: hash each.
    meta_digest: str | None = None
