"""What a source yields: an ordered list of samples to pack, the files they are read from, and
dataset-level metadata."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from shardkit.sources.files import Files
from shardkit.sources.local import LocalFiles


def source_name(rel: str) -> str:
    r"""``rel`` as it is recorded (``source``): valid UTF-8 text whatever the file system holds.

    Bytes of a file name that are not UTF-8 (which Python decodes as lone surrogates) become
    ``\xNN`` escapes, e.g. ``caf\xe9.jpg`` for the Latin-1 name ``café.jpg``; valid names are
    unchanged.

    >>> print(source_name("dog/caf\udce9.jpg"))
    dog/caf\xe9.jpg
    """
    return os.fsencode(rel).decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class SourceSample:
    """One input sample: an image file and what goes beside it in the shard.

    ``path`` is the file's path or URL; ``rel`` the path relative to the source root with POSIX
    separators, as recorded in ``source`` (always valid UTF-8: see :func:`source_name`); ``size``
    the file size in bytes (-1 when it cannot be stat'ed, e.g. a dangling link); ``label`` the
    class index (ImageFolder) and ``meta`` extra JSON fields (COCO records). ``version`` changes
    when the file does (modification time, ETag): an unfinished pack does not resume over
    changed inputs.
    """

    path: str
    rel: str
    size: int
    label: int | None = None
    meta: dict[str, Any] | None = None
    version: str = ""


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
