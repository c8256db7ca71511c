"""What every recipe here shares under torchrun: joining the process group, atomic checkpoints
with the loader's state, resuming from them, the datasets' options and running a training recipe
(its command line: :mod:`recipe_args`).

Built only on torch and shardkit's public API, like the recipes that import it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import shardkit
from shardkit.errors import ShardkitError

try:  # imported by a recipe run as a script: its directory is on the path
    from recipe_args import LOG_AT_LEAST_EVERY_S, check_device, writable_folder
except ImportError:  # imported as pipelines.ddp
    from pipelines.recipe_args import LOG_AT_LEAST_EVERY_S, check_device, writable_folder


def setup_distributed(device: str) -> tuple[int, int, torch.device]:
    """``(rank, world size, device)``; under torchrun, join the process group first (gloo on
    CPU, NCCL on CUDA) and take GPU ``LOCAL_RANK``. Without torchrun: one process."""
    if "WORLD_SIZE" not in os.environ:
        return 0, 1, torch.device(device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    here = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device(device)
    return dist.get_rank(), dist.get_world_size(), here


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a job killed while saving keeps the previous one."""
    tmp = f"{path}.tmp"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(state, tmp)
    os.replace(tmp, path)


def class_difference(saved: Any, classes: tuple[str, ...] | list[str] | None, dataset: str, *,
                     saved_in: str = "the checkpoint") -> str | None:
    """Why a model trained on the class names ``saved`` (a checkpoint's; None: an older checkpoint
    that saved only their count, an int) cannot be used on a dataset of ``classes``, or None when
    it can. Label k means class ``saved[k]``: the same count of other names would be scored (or
    trained) without a word, against the wrong labels.

    Example:
        >>> class_difference(["cat", "dog"], ("cat", "dog"), "val") is None
        True
        >>> class_difference(["cat", "dog"], ("cat", "fox"), "val")
        "its classes differ from val's at label 1: 'dog' in the checkpoint, 'fox' in the dataset"
    """
    names = list(classes or ())
    if isinstance(saved, int):
        return None if saved == len(names) else f"it has {saved} classes, {dataset} has {len(names)}"
    saved = list(saved)
    if saved == names:
        return None
    for k, (a, b) in enumerate(zip(saved, names, strict=False)):
        if a != b:
            return f"its classes differ from {dataset}'s at label {k}: {a!r} in {saved_in}, {b!r} in the dataset"
    return f"it has {len(saved)} classes, {dataset} has {len(names)}"


def load_checkpoint(path: str, *, device: torch.device, needs: tuple[str, ...], written_by: str) -> dict[str, Any]:
    """``torch.load`` a recipe's checkpoint, refused in one line naming ``path`` when it cannot be read
    (damaged, not a ``torch.save`` file) or lacks one of ``needs`` (a bare ``state_dict``, another
    recipe's checkpoint): ``written_by`` says which recipe writes the right kind.

    Raises:
        ShardkitError: as above.
    """
    try:
        ckpt = torch.load(path, map_location=device)
    except Exception as err:  # noqa: BLE001 - torch raises a different type for each way a file is not one
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if len(first) > 160:  # torch's hints run long: cut at a word
            first = first[:160].rsplit(" ", 1)[0] + " …"
        raise ShardkitError(f"cannot be read as a checkpoint: not a file torch.save wrote, or a damaged one "
                            f"({type(err).__name__}{': ' + first if first else ''})", where=path) from err
    if not isinstance(ckpt, dict):
        raise ShardkitError(f"is not a checkpoint of {written_by} (it holds a {type(ckpt).__name__})", where=path)
    missing = [key for key in needs if key not in ckpt]
    if missing:
        held = ", ".join(repr(k) for k in list(ckpt)[:4]) + (", ..." if len(ckpt) > 4 else "")
        tensors = bool(ckpt) and all(isinstance(v, torch.Tensor) for v in ckpt.values())
        bare = " (a model's bare state_dict?)" if tensors else ""
        raise ShardkitError(f"is not a checkpoint of {written_by}: it has no {', '.join(repr(k) for k in missing)} "
                            f"(it holds {held or 'nothing'}){bare}", where=path)
    return ckpt


def load_model_state(model: torch.nn.Module, ckpt: dict[str, Any], path: str) -> None:
    """``model.load_state_dict(ckpt["model"])``, a mismatch (another architecture or class count)
    refused in one line naming ``path``."""
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise ShardkitError(f"its model does not fit this one ({first[:200]})", where=path) from err


def require_batches(samples: int, batch_size: int, world: int, shards: list[str]) -> None:
    """Refuse, before the loader is built, a training run whose epoch of ``samples`` holds no full
    batch per rank (``drop_last``): it would train nothing and still save a checkpoint at a later
    epoch (and the loader would warn of it first, naming options the recipe sets itself).

    Raises:
        ShardkitError: ``samples < batch_size * world``.
    """
    if samples < batch_size * world:
        raise ShardkitError(f"the {samples:,} samples of the training data make no full batch of --batch-size "
                            f"{batch_size}"
                            + (f" on each of {world} ranks" if world > 1 else "")
                            + ": lower --batch-size", where=", ".join(shards))


def resume(path: str | None, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
           loader: shardkit.ShardLoader, device: torch.device, rank: int, arch: str | None = None) -> int:
    """Load ``path`` (when it exists) into model, optimizer and loader; return the step it holds
    (0 without a checkpoint). The checkpoint may come from another world size or batch size: the
    loader then resumes elastically (the rest of the epoch over this job's ranks).

    Raises:
        ShardkitError: the checkpoint saved class names other than the loader's (another dataset),
            or a model of another ``--arch`` than ``arch``.
    """
    if not path or not os.path.exists(path):
        return 0
    ckpt = load_checkpoint(path, device=device, needs=("model", "optimizer", "loader", "step"),
                           written_by="this training recipe")
    if arch is not None and ckpt.get("arch", arch) != arch:
        raise ShardkitError(f"cannot resume from it: it holds a {ckpt['arch']} model, and --arch is {arch} (the "
                            f"same command with --arch {ckpt['arch']}, or another --checkpoint)", where=path)
    if "classes" in ckpt and loader.classes is not None:
        why = class_difference(ckpt["classes"], loader.classes, "the training data")
        if why is not None:
            raise ShardkitError(f"cannot resume from it: {why} (another --checkpoint, or the same datasets)",
                                where=path)
    load_model_state(model, ckpt, path)
    optimizer.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"])
    step = int(ckpt["step"])
    if rank == 0:
        print(f"resumed from {path}: step {step}, epoch {loader.epoch}, {loader.remaining} of its "
              f"{len(loader)} batches to go", flush=True)  # an elastic resume: those of the samples left
    return step


def finish(*loaders: shardkit.ShardLoader | None) -> None:
    """Close the loaders and leave the process group."""
    for loader in loaders:
        if loader is not None:
            loader.close()
    if dist.is_initialized():
        dist.destroy_process_group()


#: What each kind of packed dataset is, and the recipes that train and evaluate on it.
RECIPES_BY_KIND = {
    "imagefolder": ("labelled images", "train_classifier.py", "evaluate_classifier.py"),
    "coco": ("a COCO detection dataset", "train_detector.py", "evaluate_detector.py"),
    "captions": ("captioned images", "train_contrastive.py", None),
}


def check_kind(datasets: Sequence[str], kind: str, recipe: str) -> dict[str, int]:
    """Refuse a dataset of another kind than ``kind`` (``imagefolder``, ``coco``, ``captions``),
    naming the recipe that takes it, before a loader is built (whose error would name the
    library's options, not this recipe's way out). Returns each dataset's sample count.

    Raises:
        ShardkitError: a dataset of another kind (``where``: its path), or one that is not there.
    """
    from shardkit.index import locate_dataset, read_manifest
    from shardkit.loader.read.cache import default_cache_dir

    wanted = RECIPES_BY_KIND[kind][0]
    samples = {}
    for url in datasets:  # a remote table lands in the loader's cache, which then reads it from there
        manifest = read_manifest(locate_dataset(url), cache_dir=default_cache_dir())
        found = manifest.kind
        if found != kind and found in RECIPES_BY_KIND:
            what, trains, evaluates = RECIPES_BY_KIND[found]
            takes = evaluates if recipe.startswith("evaluate") and evaluates else trains
            raise ShardkitError(f"holds {what}; {recipe} takes {wanted}: pipelines/{takes} takes this dataset",
                                where=url)
        samples[url] = manifest.num_samples
    return samples


def add_dataset_arguments(parser: argparse.ArgumentParser, what: str, *, disjoint: bool = False) -> None:
    """The training data: one packed dataset, or several mixed (``ShardLoader``'s ``weights``);
    ``disjoint``: also ``--disjoint-labels`` (ImageFolder datasets with different class lists)."""
    parser.add_argument("shards", nargs="+",
                        help=f"packed {what} (directory, index.json or URL); several: a mix of them, see --weights")
    parser.add_argument("--weights", type=float, nargs="+", default=None, metavar="W",
                        help="with several datasets: each one's share of an epoch [default: by their sizes]")
    if disjoint:
        parser.add_argument("--disjoint-labels", action="store_true",
                            help="mix datasets whose class lists differ: each keeps its own classes, its labels "
                                 "offset by the classes of the datasets before it [default: the lists must be equal]")


def dataset_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``ShardLoader`` keywords for the datasets of :func:`add_dataset_arguments`: ``dataset`` (a
    path, or the list of a mix) and ``weights``; a weight count that does not match is a usage error."""
    if args.weights is not None and len(args.weights) != len(args.shards):
        parser.error(f"--weights takes one number per dataset: {len(args.shards)} datasets, "
                     f"{len(args.weights)} weights")
    out = {"dataset": args.shards[0] if len(args.shards) == 1 else list(args.shards), "weights": args.weights}
    if getattr(args, "disjoint_labels", False):
        out["disjoint_labels"] = True
    return out


def run_training(parser: argparse.ArgumentParser, argv: list[str] | None,
                 train: Callable[[argparse.Namespace], dict[str, Any]],
                 check: Callable[[argparse.Namespace], None] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (the datasets of :func:`add_dataset_arguments` into ``args.dataset``), run
    ``check`` on the options (a recipe's own usage errors, said with ``parser.error``) and
    ``train``: shardkit's errors about the data (a dataset that is not there, a mix that does not
    fit) end as one error line, exit 2, not a traceback."""
    args = parser.parse_args(argv)
    if check is not None:
        check(args)
    args.dataset = dataset_arguments(args, parser)
    check_device(args.device, parser)
    writable_folder(parser, "--log-keys", args.log_keys)
    if args.checkpoint:  # a checkpoint that cannot be saved is said now, not after the first steps
        writable_folder(parser, "--checkpoint", os.path.dirname(os.path.abspath(args.checkpoint)), of=args.checkpoint)
    try:
        return train(args)
    except ShardkitError as err:
        message = str(err)
        if "disjoint_labels" in vars(args):  # the library's advice, in this recipe's words
            message = message.replace("disjoint_labels=True", "--disjoint-labels")
        parser.exit(2, f"{parser.prog}: error: {message}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")


def eval_keys_log(log_keys: str | None, rank: int) -> Path | None:
    """Where rank ``rank`` writes the keys it evaluates (``--log-keys``), the folder created."""
    if not log_keys:
        return None
    try:
        Path(log_keys).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ShardkitError(f"--log-keys: cannot make this folder ({err.strerror})", where=log_keys) from err
    if not os.access(log_keys, os.W_OK):
        raise ShardkitError("--log-keys: the folder is not writable", where=log_keys)
    return Path(log_keys) / f"eval-rank{rank}.txt"


class ProgressClock:
    """When a training recipe prints its progress line: every ``every`` steps (0: never), and also on
    the run's first step and whenever ``at_least_s`` seconds passed since the last line, so that a
    run whose steps are slow (a CPU, a large model) shows it is alive instead of minutes of nothing.

    Example:
        >>> clock = ProgressClock(50, at_least_s=1e9)
        >>> [step for step in range(1, 120) if clock.due(step)]
        [1, 50, 100]
    """

    def __init__(self, every: int, *, at_least_s: float = LOG_AT_LEAST_EVERY_S) -> None:
        self.every, self.at_least_s = every, at_least_s
        self.last: float | None = None

    def due(self, step: int) -> bool:
        """Whether to print the line of ``step`` (a step just taken); records the time if so."""
        import time

        if not self.every:
            return False
        now = time.monotonic()
        if self.last is None or step % self.every == 0 or now - self.last >= self.at_least_s:
            self.last = now
            return True
        return False


if __name__ == "__main__":  # a part of the recipes, not one of them
    raise SystemExit("pipelines/ddp.py is a module the training recipes import, not a recipe to run: "
                     "see docs/guides/recipes.md (pipelines/train_classifier.py --help, ...)")
