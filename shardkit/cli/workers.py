"""``--workers N|auto``: a loader's worker count as ``ShardLoader(num_workers=...)`` takes it, and
pack's writer count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from shardkit.errors import LoaderError
from shardkit.machine import auto_workers, usable_cores

__all__ = ["WORKERS", "WRITERS"]


class _Count(click.ParamType):
    """An int >= ``minimum``, or ``auto``: what ``auto()`` picks on this machine."""

    name = "N|auto"

    def __init__(self, minimum: int, auto: Callable[[], int], what: str) -> None:
        self.minimum, self.auto, self.what = minimum, auto, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            count = value
        elif str(value).strip().lower() == "auto":
            try:
                return self.auto()
            except LoaderError as err:
                self.fail(f"auto: {err.message}", param, ctx)
        else:
            try:
                count = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is neither a count of {self.what} nor 'auto'", param, ctx)
        if count < self.minimum:
            self.fail(f"{count} is below {self.minimum}", param, ctx)
        return count


#: The ``type=`` of a ``--workers`` option of the loader: ``num_workers="auto"``'s count.
WORKERS = _Count(0, auto_workers, "workers")
#: The ``type=`` of ``shardkit pack --workers``: auto is the cores this process may run on.
WRITERS = _Count(1, usable_cores, "writers")
