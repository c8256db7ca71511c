"""A command's folder or URL argument (``pack SRC DST``, ``info DATASET``...): not empty."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["LOCATION"]


class _Location(click.ParamType):
    """A local path or an fsspec URL, as given; an empty one (``""``, an unset shell variable) is
    a usage error instead of the current folder or a message about no name at all."""

    name = "PATH|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            self.fail("is empty: name a folder or a URL (an unset shell variable?)", param, ctx)
        return text


#: The ``type=`` of a folder or URL argument.
LOCATION = _Location()
