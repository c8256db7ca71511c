"""A command's folder, file or URL argument (``pack SRC DST``, ``info DATASET``, ``--out``...):
not empty."""

from __future__ import annotations

from typing import Any

import click

from shardkit.storage import url_typo

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
        if "URL" in self.name and (typo := url_typo(text)):
            self.fail(typo, param, ctx)
        return text


#: The ``type=`` of a folder or URL argument.
LOCATION = _Location("PATH|URL", "a folder or a URL")
#: The ``type=`` of a file or URL to read (``--annotations``).
FILE_OR_URL = _Location("FILE|URL", "a file or a URL")
#: The ``type=`` of a local folder argument.
FOLDER = _Location("DIR", "a folder")
#: The ``type=`` of a file to write.
FILE = _Location("FILE", "a file")
