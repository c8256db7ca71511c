"""``--workers N|auto``: a loader's worker count as ``ShardLoader(num_workers=...)`` takes it, and
pack's writer count."""

from __future__ import annotations

from typing import Any

import click

from shardkit.errors import LoaderError
from shardkit.machine import auto_workers, usable_cores

__all__ = ["WORKERS", "WRITERS"]


class _Workers(click.ParamType):
    """An int >= 0, or ``auto``: what ``num_workers="auto"`` picks on this machine."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            count = value
        elif str(value).strip().lower() == "auto":
            try:
                return auto_workers()
            except LoaderError as err:
                self.fail(f"auto: {err.message}", param, ctx)
        else:
            try:
                count = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is neither a count of workers nor 'auto'", param, ctx)
        if count < 0:
            self.fail(f"{count} is below 0", param, ctx)
        return count


#: The ``type=`` of a ``--workers`` option of the loader.
WORKERS = _Workers()


class _Writers(click.ParamType):
    """An int >= 1, or ``auto``: the cores this process may run on (``pack --workers``)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            count = value
        elif str(value).strip().lower() == "auto":
            return usable_cores()
        else:
            try:
                count = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is neither a count of writers nor 'auto'", param, ctx)
        if count < 1:
            self.fail(f"{count} is below 1", param, ctx)
        return count


#: The ``type=`` of ``shardkit pack --workers``.
WRITERS = _Writers()
