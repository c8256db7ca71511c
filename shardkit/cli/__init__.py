"""The ``shardkit`` command: a thin click group over the library (pack, info, verify, bench,
doctor, serve).

Library errors become one-line messages and exit code 1; usage errors exit 2 (click's).
Ctrl-C exits 130 and SIGTERM (a scheduler preempting the job) 143, each after one line; the work
stops as on Ctrl-C (a pack stops its workers and resumes when re-run); another while the
``shardkit`` process exits ends it at once, with the same code (once the worker processes are
joined, it is ignored). Heavy imports (torch) happen inside the commands that need them, so
``--help`` is fast.
"""

from __future__ import annotations

import multiprocessing.util
import os
import signal
import sys
import threading
from types import FrameType

import click

from shardkit._version import __version__
from shardkit.errors import ShardkitError, reraise_interrupt


def _clear_line() -> None:
    """In a terminal, erase the current line of stderr: a progress bar interrupted while it was
    being drawn (before its owner could close it) must not share the line with our message."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            try:
                return super().invoke(ctx)
            except Exception as err:  # Ctrl-C that Python delivered wrapped (a lazy import's class body)
                if isinstance(err, ShardkitError):
                    raise
                reraise_interrupt(err)
                raise
        except ShardkitError as err:
            _clear_line()
            click.secho(f"error: {err}", fg="red", err=True)
            sys.exit(1)
        except KeyboardInterrupt as err:  # also one re-raised from a wrapper above
            terminated = isinstance(getattr(err, "interrupt", err), Terminated)  # a bench's Interrupted wraps it
            code = 143 if terminated else 130
            if _process_entry:  # the shardkit process itself: it is exiting
                _exit_at_once_on_another(code)
            _clear_line()
            # Only pack resumes; saying so after verify or bench would send people looking for it.
            resumes = ctx.invoked_subcommand == "pack"
            click.echo(("terminated" if terminated else "interrupted")
                       + ("; re-run the same command to resume" if resumes else ""), err=True)
            sys.exit(code)


def _exit_at_once_on_another(code: int) -> None:
    """The work is stopped and the process is exiting: another Ctrl-C (an impatient user presses
    it twice) or SIGTERM ends it at once with ``code``, instead of a traceback from whatever
    clean-up it interrupts and a death by signal."""
    def now(signum: int, frame: FrameType | None) -> None:
        sys.stderr.flush()
        os._exit(code)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, now)
        # In its last instants the interpreter gives a signal with a Python handler its default
        # action back, and another Ctrl-C would end the process by the signal, not with ``code``:
        # both are ignored once the last exit function that can wait (multiprocessing's, which
        # joins the worker processes) is done. Ignored signals are left as they are.
        multiprocessing.util.Finalize(None, _ignore_exit_signals, exitpriority=_LAST)


#: The lowest ``exitpriority``: multiprocessing runs such a finalizer after joining its children.
_LAST = -(1 << 30)


def _ignore_exit_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it stops the work as Ctrl-C does."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardkit")
def cli() -> None:
    """Pack image datasets into tar shards and stream them fast into PyTorch."""


def _register() -> None:
    from shardkit.cli import bench, doctor, index, info, pack, serve, verify

    cli.add_command(pack.pack_command)
    cli.add_command(info.info_command)
    cli.add_command(verify.verify_command)
    cli.add_command(bench.bench_command)
    cli.add_command(doctor.doctor_command)
    cli.add_command(index.index_command)
    cli.add_command(serve.serve_command)


#: Whether this process is the ``shardkit`` command (:func:`main`), whose signal handlers are its
#: own to set: the group also runs inside other programs (click's ``CliRunner``, a notebook, a test
#: process), whose handlers an interrupted command must leave as they were.
_process_entry = False


def exits_after_command() -> bool:
    """Whether this process is the ``shardkit`` command, which exits once its command ends: its
    process-wide state (signal handlers) is its own to change, unlike a program running the group
    in process (a test's ``CliRunner``, a notebook)."""
    return _process_entry


def main() -> None:
    """Console-script entry point."""
    global _process_entry
    _process_entry = True
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli(prog_name="shardkit")
    finally:
        # CPython marks a KeyboardInterrupt that ends a string exec/eval (a namedtuple or dataclass
        # that a lazy import builds, e.g. PIL's plugins) as unhandled even when we catch it, and
        # under ``python -m shardkit`` then ends the process by SIGINT (-2) instead of our 130.
        # A string exec clears that mark; one that does reach the top still sets it again.
        exec("")


_register()
