"""The checks ``shardkit bench`` makes of its command line before any work: its paths, the
options that fit the bench it runs, and the values of ``--feeders``, ``--dali-threads`` and
``--max-size``; each bad one is one line (a usage error, or a :class:`BenchError`)."""

from __future__ import annotations

import os
from typing import Any

import click
from click.core import ParameterSource

from shardkit.bench.report import check_writable
from shardkit.errors import ShardkitError
from shardkit.pack.options import parse_size

__all__ = ["CLASSIFIER_SHARDS", "DETECTOR_SHARDS", "BenchError", "check_source", "dali_threads_option",
           "feeders_option", "needs_shards", "png_path", "refuse_other_modes_options", "writable"]


#: Options of the training bench alone, and of the loader bench alone (by parameter name).
_TRAIN_ONLY = ("steps", "dali_threads", "dali_hw_load", "dali_prefetch", "isolate")
#: Options of the classifier training bench that a detector's does not take.
_CLASSIFIER_ONLY = ("dali_threads", "dali_hw_load", "dali_prefetch", "isolate")
_LOADERS_ONLY = ("epochs", "drop_caches", "no_webdataset", "jpeg_restart", "plot", "transform", "storage_option")


def refuse_other_modes_options(ctx: click.Context, *, train: bool, detector: bool = False) -> None:
    """An option given on the command line that the chosen bench does not use is refused, not
    ignored (``--feeders``, ``--sleep-waits`` and ``--contender`` say it themselves)."""
    flags = {p.name: p.secondary_opts[0] if p.secondary_opts and not ctx.params[p.name] else p.opts[0]
             for p in ctx.command.params if p.name}  # a --no-x flag as given

    def given(names: tuple[str, ...]) -> list[str]:
        return [name for name in names
                if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]

    if detector and (unused := given(_CLASSIFIER_ONLY)):
        raise click.UsageError(f"{', '.join(flags[name] for name in unused)}: for --train with a classifier; a "
                               "detector's bench runs in this process with its own loaders: leave "
                               f"{'it' if len(unused) == 1 else 'them'} out")
    if other := given(_LOADERS_ONLY if train else _TRAIN_ONLY):
        what = ", ".join(flags[name] for name in other)
        raise click.UsageError(f"{what}: for the loader bench, which --train replaces (it times --steps): leave "
                               f"{'it' if len(other) == 1 else 'them'} out" if train else
                               f"{what}: for --train, the training bench (the loader bench times --epochs): add "
                               f"--train MODEL or leave {'it' if len(other) == 1 else 'them'} out")


def png_path(plot: str, out: str | None) -> str:
    """``--plot``'s file: a PNG (``.png`` added to a name without a suffix, as matplotlib would),
    not the ``--out`` report's."""
    root, suffix = os.path.splitext(plot)
    if os.path.basename(root).startswith(".") or not os.path.basename(root):
        raise BenchError("names no file (e.g. DIR/bench.png)", where=f"--plot {plot}")
    if not suffix:
        plot += ".png"
    elif suffix.lower() != ".png":
        raise BenchError(f"--plot draws a PNG: name it {root}.png", where=f"--plot {plot}")
    if out is not None and os.path.abspath(plot) == os.path.abspath(out):
        raise BenchError("is also --out, the JSON report: give each its own file", where=f"--plot {plot}")
    return plot


class BenchError(ShardkitError):
    """The bench cannot run as asked (its data, paths or counts): one ``error:`` line, exit 1,
    before any timing starts."""


def check_source(src: str, annotations: str | None, *, captions: bool = False) -> None:
    """SRC a directory (with --captions: or a caption table) and --annotations a file,
    said in one line as pack says it."""
    if not os.path.exists(src):
        raise BenchError("does not exist", where=src)
    if captions and os.path.isfile(src):
        from shardkit.sources.table import is_table

        if not is_table(src):
            raise BenchError("is a file, not a caption table (.csv, .tsv, .jsonl, .parquet) or a folder",
                             where=src)
        return
    if not os.path.isdir(src):
        raise BenchError("is a file, not a directory of images", where=src)
    if os.path.isfile(os.path.join(src, "index.json")):
        raise BenchError("is a packed dataset (it holds index.json); bench takes the image folder it was packed "
                         f"from as SRC and the pack as --shards: shardkit bench IMAGES --shards {src}", where=src)
    if annotations is not None and not os.path.isfile(annotations):
        what = "is a directory, not a COCO instances JSON file" if os.path.isdir(annotations) else "does not exist"
        raise BenchError(what, where=f"--annotations {annotations}")


class _Pixels(click.ParamType):
    """A side length in pixels, >= 1. A byte size (``256MB``, what ``pack --max-size`` takes) is
    told apart from a typo."""

    name = "PIXELS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            pixels = int(str(value))
        except ValueError:
            if _is_byte_size(str(value)):
                self.fail(f"{value!r} is a byte size: bench's --max-size is the longer image side in pixels "
                          "(pack's is bytes per shard)", param, ctx)
            self.fail(f"{value!r} is not a whole number of pixels", param, ctx)
        if pixels < 1:
            self.fail(f"{pixels} is below 1", param, ctx)
        return pixels


def _is_byte_size(text: str) -> bool:
    """Whether ``text`` is a size with a unit, as ``pack --max-size`` takes it (``256MB``, ``1G``)."""
    try:
        parse_size(text)
    except ValueError:
        return False
    return any(c.isalpha() for c in text)


#: The ``type=`` of bench's ``--max-size``.
PIXELS = _Pixels()


def writable(path: str, option: str) -> str:
    """``path`` for a report written after the run, checked before it: its folder (that of the file
    a symlink names) is created as pack creates its destination, then it is written as the report
    will be, without writing (:func:`~shardkit.bench.report.check_writable`); ``path`` must not be
    a directory."""
    example = "DIR/report.png" if option == "--plot" else "DIR/report.json"
    if os.path.isdir(path):
        raise BenchError(f"is a directory; name the file to write (e.g. {example})", where=f"{option} {path}")
    if path.endswith(("/", os.sep)):
        raise BenchError(f"names a folder (it ends in /); name the file to write (e.g. {example})",
                         where=f"{option} {path}")
    parent = os.path.dirname(os.path.realpath(path))
    missing = []
    folder = parent
    while folder and not os.path.lexists(folder) and folder != os.path.dirname(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    ctx = click.get_current_context(silent=True)
    if missing and ctx is not None:  # a bench refused or stopped before its report leaves none behind
        ctx.call_on_close(lambda: _remove_if_empty(missing))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        in_the_way = _not_a_folder(parent)
        if in_the_way is not None:
            what = "is a file, not a folder" if os.path.isfile(in_the_way) else "is not a folder"
            raise BenchError(f"{in_the_way} {what}", where=f"{option} {path}") from None
        raise BenchError(f"cannot create its folder {parent} ({err.strerror or err})",
                         where=f"{option} {path}") from None
    try:
        check_writable(path)
    except OSError as err:
        raise BenchError(f"cannot be written ({err.strerror or err})", where=f"{option} {path}") from None
    return path


def _remove_if_empty(folders: list[str]) -> None:
    """Remove ``folders`` (deepest first) that :func:`writable` created, where nothing was written."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:  # something was written there (or it is gone): keep the rest as well
            return


def _not_a_folder(folder: str) -> str | None:
    """The path on the way to ``folder`` (``folder`` included) that is there but no directory (a
    file where a folder would be created), or None.

    >>> _not_a_folder("/dev/null/reports"), _not_a_folder("/no/such/folder")
    ('/dev/null', None)
    """
    here = folder
    while not os.path.exists(here):
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up
    return None if os.path.isdir(here) else here


CLASSIFIER_SHARDS = "SRC (shardkit pack SRC SHARDS)"
DETECTOR_SHARDS = ("the COCO source's annotated images (shardkit pack SRC SHARDS --annotations "
                    "ANNOTATIONS --drop-empty)")


def needs_shards(shards: str | None, what: str) -> str:
    """``--shards`` for ``--train``: a packed dataset (checked before torch is loaded)."""
    from shardkit.index.manifest_io import locate_dataset

    if shards is None:
        raise click.UsageError(f"--train needs --shards naming a packed dataset of {what}")
    if not locate_dataset(shards).exists("index.json"):
        wrong = "holds no index.json" if os.path.exists(shards) or "://" in shards else "does not exist"
        raise BenchError(f"{wrong}; --train needs a packed dataset of {what}", where=f"--shards {shards}")
    return shards


def feeders_option(value: str, workers: int, classifier: bool, contenders: tuple[str, ...]) -> int | str:
    """--feeders as ShardLoader's ``feeders`` ("auto" or a count from 0 to --workers)."""
    if value == "auto":
        return value
    try:
        count = int(value)
    except ValueError:
        raise click.UsageError(f"--feeders must be auto or a whole number, got {value!r}") from None
    if not classifier:
        raise click.UsageError("--feeders applies to --train with a classifier (resnet18, resnet50)")
    if contenders and "shardloader" not in contenders:
        raise click.UsageError("--feeders sets the shardloader contender's feeders: add --contender shardloader")
    if not 0 <= count <= workers:
        raise click.UsageError(f"--feeders must be from 0 to --workers ({workers}): the feeders share the workers, "
                               f"got {count}")
    return count


def dali_threads_option(text: str | None) -> tuple[int, ...]:
    """``--dali-threads 8,12,16`` as numbers; a usage error names a bad one."""
    if text is None:
        return ()
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.UsageError(f"--dali-threads takes whole numbers >= 1 separated by commas, got {text!r}")
    return tuple(dict.fromkeys(counts))
