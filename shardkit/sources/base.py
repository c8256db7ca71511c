"""What a source yields: an ordered list of samples to pack, the files they are read from, and
dataset-level metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardkit.sources.files import Files
from shardkit.sources.local import LocalFiles
from shardkit.sources.sample import SourceSample, source_name

__all__ = ["SourceListing", "SourceSample", "source_name"]


@dataclass(frozen=True)
class SourceListing:
    """All samples of a source in their canonical order, and dataset-level fields.

    ``files`` reads the samples' paths (local files by default; see :mod:`shardkit.sources.files`).
    """

    kind: str
    root: str
    samples: list[SourceSample]
    classes: list[str] | None = None
    categories: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Inputs listed but not packable, as ``{source, reason}``: they count as skipped inputs.
    warnings: list[dict[str, str]] = field(default_factory=list)
    #: Problems of annotation records (COCO), reported apart from skipped inputs:
    #: ``{source, reason, annotations: <records concerned>, dropped: <whether left out>}``.
    annotation_problems: list[dict[str, Any]] = field(default_factory=list)
    #: A digest standing for every sample's ``meta`` (e.g. the annotation file's sha256), so
    #: the pack fingerprint need not re-serialise per-sample metadata; ``None``: hash each.
    meta_digest: str | None = None
    files: Files = field(default_factory=LocalFiles)
