"""What ``shardkit bench`` writes when a bench ends, finished or stopped part-way: its table and
``report:`` lines (to standard error where ``--out`` is standard output), the JSON report and the
plot, kept in a temporary file when a write fails, so that a run is never lost.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from shardkit.cli.bench_args import BenchError
from shardkit.errors import interrupt_behind

if TYPE_CHECKING:
    from shardkit.bench.finished import Interrupted

__all__ = ["is_stdout", "report_stopped", "save", "save_before_stopping", "say", "terminal_width"]


def is_stdout(path: str | None) -> bool:
    """Whether ``path`` is this process's standard output (``--out /dev/stdout``, piped or
    redirected): the table and the ``report:`` line then go to standard error, leaving the JSON
    alone on standard output."""
    if not path:
        return False
    try:
        named, stdout = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file, or an output without a descriptor
        return False
    return (named.st_dev, named.st_ino) == (stdout.st_dev, stdout.st_ino)


def save(report: dict[str, Any], out: str | None, plot: str | None,
          plot_report: Callable[[dict[str, Any], str], None] | None = None) -> None:
    """Write the JSON report and the plot. Their paths were checked before the run; should a write
    still fail, the report goes to a temporary file, named in the error: a run is never lost."""
    import tempfile

    from shardkit.bench import write_json

    try:
        if out:
            try:
                write_json(report, out)
            except BrokenPipeError:
                if not is_stdout(out):
                    raise
                return  # the reader of this output took what it wanted (``| head``), as with ``cat``
            say(f"report: {out}", err=is_stdout(out))
        if plot and plot_report is not None:
            plot_report(report, plot)
            say(f"plot:   {plot}")
    except OSError as err:
        fd, kept = tempfile.mkstemp(prefix="shardkit-bench-", suffix=".json")
        os.close(fd)
        write_json(report, kept)
        where = err.filename or out or plot
        raise BenchError(f"cannot write it ({err.strerror or err}); the report is kept in {kept}",
                         where=str(where)) from None


def report_stopped(stopped: Interrupted, table: Callable[[dict[str, Any], int | None], str], out: str | None,
                   plot: str | None = None,
                   plot_report: Callable[[dict[str, Any], str], None] | None = None) -> NoReturn:
    """A bench stopped part-way (Ctrl-C, SIGTERM): the table and ``out`` (and ``plot``) of the runs
    it finished, then the exit of any interrupted command (130, 143 for SIGTERM)."""
    from shardkit import cli

    if cli.exits_after_command() and threading.current_thread() is threading.main_thread():
        # Torch's handler raises in this thread when a stopped run's DataLoader workers end (a
        # signal sent to the whole process group reaches them too), which would cut the report
        # short; the runs are over, and the shardkit process exits once it is written.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if sys.stderr.isatty() and not isinstance(stopped.interrupt, cli.Terminated):  # off the line a ^C echoed on
        click.echo(err=True)
    if stopped.report is None:
        click.echo("no run had finished: nothing was measured, no report written", err=True)
    else:
        click.echo(table(stopped.report, terminal_width()), err=is_stdout(out))
        save_before_stopping(stopped.report, out, plot, plot_report)
    raise stopped.interrupt from None  # said and exited as any interrupted command


def say(line: str, *, err: bool = False) -> None:
    """Echo ``line``; a reader gone from a pipe (``| head``) is no failure of the report already
    written: the rest of the output is dropped, as ``cat`` would."""
    try:
        click.echo(line, err=err)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, (sys.stderr if err else sys.stdout).fileno())  # no second error at exit's flush
        os.close(devnull)


def _clear_line_of_caret() -> None:
    """Off the line a terminal's ``^C`` echo was left on."""
    if sys.stderr.isatty():
        click.echo(err=True)


def save_before_stopping(report: dict[str, Any], out: str | None, plot: str | None = None,
                         plot_report: Callable[[dict[str, Any], str], None] | None = None) -> None:
    """:func:`save` for a bench that stops (interrupted, or a run lost): a failed write is said in
    its ``error:`` line (where the report was kept instead) and the bench stops for its own reason,
    with its own exit status."""
    left = [what for what, path in (("report", out), ("plot", plot)) if path]
    try:
        save(report, out, None)
        left = left[1:] if out else left
        save(report, None, plot, plot_report)
    except BenchError as err:
        click.secho(f"error: {err}", fg="red", err=True)
    except (KeyboardInterrupt, Exception) as err:
        # stopped again while writing (a Ctrl-C may come wrapped, from a lazy import's class body):
        # say what is not written, and stop at once
        again = interrupt_behind(err)
        if again is None:
            raise
        _clear_line_of_caret()
        click.echo(f"stopped again: {' and '.join(left)} not written", err=True)
        raise again from None


def terminal_width() -> int | None:
    """The terminal's columns when stdout is one (the table then fits them), else None."""
    import shutil

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None
