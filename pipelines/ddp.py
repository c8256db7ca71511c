"""What every recipe here shares under torchrun: joining the process group, atomic checkpoints
with the loader's state, resuming from them, and the options that control a run.

Built only on torch and shardkit's public API, like the recipes that import it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

import shardkit
from shardkit.errors import ShardkitError


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


def resume(path: str | None, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
           loader: shardkit.ShardLoader, device: torch.device, rank: int) -> int:
    """Load ``path`` (when it exists) into model, optimizer and loader; return the step it holds
    (0 without a checkpoint). The checkpoint may come from another world size or batch size: the
    loader then resumes elastically (the rest of the epoch over this job's ranks)."""
    if not path or not os.path.exists(path):
        return 0
    ckpt = torch.load(path, map_location=device)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"])
    step = int(ckpt["step"])
    if rank == 0:
        print(f"resumed from {path}: step {step}, epoch {loader.epoch}, "
              f"batch {loader.state_dict()['batches_consumed']} of {len(loader)}", flush=True)
    return step


def finish(*loaders: shardkit.ShardLoader | None) -> None:
    """Close the loaders and leave the process group."""
    for loader in loaders:
        if loader is not None:
            loader.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def add_dataset_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The training data: one packed dataset, or several mixed (``ShardLoader``'s ``weights``)."""
    parser.add_argument("shards", nargs="+",
                        help=f"packed {what} (directory, index.json or URL); several: a mix of them, see --weights")
    parser.add_argument("--weights", type=float, nargs="+", default=None, metavar="W",
                        help="with several datasets: each one's share of an epoch (default: by their sizes)")


def dataset_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``ShardLoader`` keywords for the datasets of :func:`add_dataset_arguments`: ``dataset`` (a
    path, or the list of a mix) and ``weights``; a weight count that does not match is a usage error."""
    if args.weights is not None and len(args.weights) != len(args.shards):
        parser.error(f"--weights takes one number per dataset: {len(args.shards)} datasets, "
                     f"{len(args.weights)} weights")
    return {"dataset": args.shards[0] if len(args.shards) == 1 else list(args.shards), "weights": args.weights}


def run_training(parser: argparse.ArgumentParser, argv: list[str] | None,
                 train: Callable[[argparse.Namespace], dict[str, Any]]) -> dict[str, Any]:
    """Parse ``argv`` (the datasets of :func:`add_dataset_arguments` into ``args.dataset``) and
    ``train``: shardkit's errors about the data (a dataset that is not there, a mix that does not
    fit) end as one error line, exit 2, not a traceback."""
    args = parser.parse_args(argv)
    args.dataset = dataset_arguments(args, parser)
    check_device(args.device, parser)
    try:
        return train(args)
    except ShardkitError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")


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


class RecipeParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints its whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


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


def eval_keys_log(log_keys: str | None, rank: int) -> Path | None:
    """Where rank ``rank`` writes the keys it evaluates (``--log-keys``), the folder created."""
    if not log_keys:
        return None
    Path(log_keys).mkdir(parents=True, exist_ok=True)
    return Path(log_keys) / f"eval-rank{rank}.txt"


def add_run_arguments(parser: argparse.ArgumentParser, *, log_every: int) -> None:
    """The options every training recipe takes: length, loader, device, checkpoints, logging."""
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train in total")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps in total (0: no limit)")
    parser.add_argument("--workers", type=count_or_auto, default="auto", help=WORKERS_HELP)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (under torchrun each rank takes GPU LOCAL_RANK)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the loader's order and augmentation")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file: resume from it if present, save to it")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="save every N steps (a preempted job loses at most N); 0: only at the end")
    parser.add_argument("--log-every", type=int, default=log_every,
                        help="print loss and throughput every N steps; 0: never")
    parser.add_argument("--log-keys", default=None, metavar="DIR",
                        help="append each step's sample keys to DIR/train-rank<R>.txt (to audit epochs)")
    parser.add_argument("--stop-after-steps", type=int, default=0,
                        help="testing: SIGKILL every rank after this step, as a preemption would (0: never)")
