"""``--workers N|auto``: a worker count as ``ShardLoader(num_workers=...)`` takes it."""

from __future__ import annotations

from typing import Any

import click

from shardkit.errors import LoaderError
from shardkit.machine import auto_workers

__all__ = ["WORKERS"]


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
