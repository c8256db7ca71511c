"""The ``shardkit`` command's entry point: :func:`shardkit.cli.main`, with a Ctrl-C that lands
while the command line's modules import (a few tenths of a second) said as the commands say one,
``interrupted`` and exit code 130, not as a traceback. Imports nothing heavy itself."""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point."""
    from shardkit.errors import interrupt_behind

    try:
        from shardkit.cli import main as run
    except BaseException as err:  # a Ctrl-C, perhaps wrapped by a class body it hit
        if not isinstance(interrupt_behind(err), KeyboardInterrupt):
            raise
        sys.stderr.write("interrupted\n")
        exec("")  # see shardkit.cli.main: a Ctrl-C that ended a string exec would end the process by SIGINT
        sys.exit(130)
    run()
