"""One input sample of a source, and how its path is recorded. A leaf: imports nothing of shardkit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["SourceSample", "source_name"]


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
    class index (ImageFolder), ``caption`` the text of a captioned image (its ``txt`` member) and
    ``meta`` extra JSON fields (COCO records; a caption's extra fields). ``version`` changes
    when the file does (modification time, ETag): an unfinished pack does not resume over
    changed inputs.
    """

    path: str
    rel: str
    size: int
    label: int | None = None
    meta: dict[str, Any] | None = None
    version: str = ""
    caption: str | None = None
