"""A command's folder, file or URL argument (``pack SRC DST``, ``info DATASET``, ``--out``...):
not empty."""

from __future__ import annotations

import os
from typing import Any

import click

#: URL schemes of object stores and web servers: ``s3:/bucket`` (one slash) is a typo of ``s3://bucket``,
#: not a local folder named ``s3:``.
_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "hf", "memory",
                      "oci", "r2"})

__all__ = ["FILE", "FILE_OR_URL", "FOLDER", "LOCATION"]


class _Location(click.ParamType):
    """A local path (or, where ``what`` says so, an fsspec URL), as given; an empty one (``""``,
    an unset shell variable) is a usage error instead of the current folder, no report at all, or
    a message about no name at all."""

    def __init__(self, name: str, what: str) -> None:
        self.name, self.what = name, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            self.fail(f"is empty: name {self.what} (an unset shell variable?)", param, ctx)
        scheme, colon, rest = text.partition(":")
        if (colon and "URL" in self.name and scheme.lower() in _SCHEMES and not rest.startswith("//")
                and not os.path.exists(text)):
            self.fail(f"{text!r} is a local path as written; a URL needs two slashes: "
                      f"{scheme}://{rest.lstrip('/')}", param, ctx)
        return text


#: The ``type=`` of a folder or URL argument.
LOCATION = _Location("PATH|URL", "a folder or a URL")
#: The ``type=`` of a file or URL to read (``--annotations``).
FILE_OR_URL = _Location("FILE|URL", "a file or a URL")
#: The ``type=`` of a local folder argument.
FOLDER = _Location("DIR", "a folder")
#: The ``type=`` of a file to write.
FILE = _Location("FILE", "a file")
