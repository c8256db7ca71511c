"""The command line every recipe here shares: its parser and help, option types that refuse a
value that cannot work as a usage error (a whole number, a positive learning rate, a writable
folder, a device this machine has, a torchvision model), and the options of a run.

Built only on torch and argparse, like the recipes that import it.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any, NoReturn

import torch


def check_device(device: str, parser: argparse.ArgumentParser) -> None:
    """Refuse ``--device`` values this machine cannot run, as a usage error."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        parser.error(f"--device {device}: expected cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {device}: no CUDA device is available (use --device cpu)")


def model_name(kind: str) -> Callable[[str], str]:
    """An argparse type: the name of a torchvision model of ``kind`` (``classification``:
    ``torchvision.models``; ``detection``: ``torchvision.models.detection``)."""
    import torchvision

    module = torchvision.models if kind == "classification" else torchvision.models.detection

    def check(name: str) -> str:
        known = torchvision.models.list_models(module=module)
        if name not in known:
            raise argparse.ArgumentTypeError(f"{name!r} is not a torchvision {kind} model "
                                             f"(e.g. {', '.join(known[:4])}; all: torchvision.models.list_models)")
        return name

    return check


WORKERS_HELP = ("loader worker processes per rank ('auto': this rank's share of the usable cores less one, "
                "1 to 32; a validation loader gets as many, idle while training runs)")


class RecipeHelp(argparse.RawDescriptionHelpFormatter):
    """``--help`` with the description as written and each option's default, ``[default: X]``,
    unless its help already gives one, or it has none (a flag, an option off by default)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default == argparse.SUPPRESS
                or not action.option_strings):
            return text
        return f"{text} [default: {default}]"


class RecipeParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints its whole usage block first)
    and whose ``--help`` shows the defaults (:class:`RecipeHelp`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", RecipeHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if "unrecognized arguments: --resume" in message and any("--checkpoint" in a.option_strings
                                                                  for a in self._actions):
            message += " (resuming needs no option: the same command with --checkpoint FILE resumes from it)"
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def at_least(low: int) -> Callable[[str], int]:
    """An option's type: a whole number >= ``low`` (a crop side of 0 or a batch of -5 is refused as
    a usage error, not met later as a traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {value}")
        return value
    return parse


def positive_float(text: str) -> float:
    """An option's type: a finite number > 0 (a learning rate of -1 or nan is refused as a usage
    error, not met later as the optimizer's traceback or a run of nan losses)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def writable_folder(parser: argparse.ArgumentParser, option: str, folder: str | None, *, of: str | None = None
                    ) -> None:
    """Make ``folder`` (an option's value, or with ``of`` the folder of the file that value names)
    now, and refuse it as a usage error where it cannot be made or written, before any step runs."""
    if not folder:
        return
    name, which = (f"{option} {of}", f"its folder {folder}") if of else (f"{option} {folder}", "this folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        parser.error(f"{name}: cannot make {which} ({err.strerror})")
    if not os.access(folder, os.W_OK):
        parser.error(f"{name}: {which} is not writable")


def check_sizes(parser: argparse.ArgumentParser, min_size: int, max_size: int, *, given: bool = True) -> None:
    """Refuse a ``--max-size`` below ``--min-size`` as a usage error (``given``: both came from the
    command line, else from a checkpoint too), before any data is read (equal sizes are taken, as
    torchvision's detection models take them)."""
    if max_size < min_size:
        source = "" if given else " (the checkpoint's sizes where not given)"
        parser.error(f"--max-size {max_size} must not be below --min-size {min_size}{source}")


def check_image_size(model: torch.nn.Module, arch: str, size: int) -> None:
    """Refuse, in one line, a model that torchvision builds for one input size (its ViTs, whose
    ``image_size`` is fixed) at another ``--size``: its first step fails with an ``AssertionError``.

    Raises:
        ShardkitError: ``size`` is not the model's.
    """
    from shardkit.errors import ShardkitError

    fixed = getattr(model, "image_size", None)
    if isinstance(fixed, int) and fixed != size:
        raise ShardkitError(f"--arch {arch} takes {fixed}x{fixed} images only (torchvision builds it for that size), "
                            f"not --size {size}: pass --size {fixed}")


def checkpoint_arch(parser: argparse.ArgumentParser, given: str | None, checkpoint: str, held: str) -> str:
    """The model to build for ``checkpoint``, which holds a ``held`` model: an ``--arch`` that names
    another is refused (its weights would not load, or the score would not be the run's)."""
    if given is not None and given != held:
        parser.error(f"--arch {given}: --checkpoint {checkpoint} holds a {held} model "
                     f"(leave --arch out, or give {held})")
    return held


def count_or_auto(text: str) -> int | str:
    """An option's value: ``auto`` or a whole number >= 0."""
    if text == "auto":
        return text
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number >= 0, got {text!r}")
    return count


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every evaluation recipe takes: loader workers, device, key logging."""
    parser.add_argument("--workers", type=count_or_auto, default="auto", help=WORKERS_HELP)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (under torchrun each rank takes GPU LOCAL_RANK)")
    parser.add_argument("--log-keys", default=None, metavar="DIR",
                        help="write the sample keys each rank evaluates to DIR/eval-rank<R>.txt")


#: A training recipe prints a progress line at least this often (seconds), whatever ``--log-every``.
LOG_AT_LEAST_EVERY_S = 30.0


def add_run_arguments(parser: argparse.ArgumentParser, *, log_every: int) -> None:
    """The options every training recipe takes: length, loader, device, checkpoints, logging."""
    parser.add_argument("--epochs", type=at_least(1), default=1, help="epochs to train in total")
    parser.add_argument("--steps", type=at_least(0), default=0,
                        help="stop after this many steps in total (0: no limit)")
    parser.add_argument("--workers", type=count_or_auto, default="auto", help=WORKERS_HELP)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (under torchrun each rank takes GPU LOCAL_RANK)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the loader's order and augmentation")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file: resume from it if present, save to it")
    parser.add_argument("--checkpoint-every", type=at_least(0), default=100,
                        help="save every N steps (a preempted job loses at most N); 0: only at the end")
    parser.add_argument("--log-every", type=at_least(0), default=log_every,
                        help="print loss and throughput every N steps, and on the first step and at least every "
                             f"{LOG_AT_LEAST_EVERY_S:.0f} s (a slow run on the CPU); 0: never")
    parser.add_argument("--log-keys", default=None, metavar="DIR",
                        help="append each step's sample keys to DIR/train-rank<R>.txt (to audit epochs)")
    parser.add_argument("--stop-after-steps", type=at_least(0), default=0,
                        help="testing: SIGKILL every rank after this step, as a preemption would (0: never)")


if __name__ == "__main__":  # a part of the recipes, not one of them
    raise SystemExit("pipelines/recipe_args.py is a module the recipes import, not a recipe to run: "
                     "see docs/guides/recipes.md (pipelines/train_classifier.py --help, ...)")
