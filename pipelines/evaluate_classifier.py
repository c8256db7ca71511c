"""Evaluate an image classifier on packed shards under torchrun: top-1 with each sample counted once.

The loader is built with ``even_batches=False``: over all ranks every validation sample is
delivered exactly once, the last batch is short and ranks may hold one batch more than others.
So no collective may run per batch; each rank sums ``correct`` and ``total`` and one
``all_reduce`` after the loop gives the exact accuracy (the default ``even_batches=True`` pads
the ranks with repeated samples, which would count some twice).

    torchrun --nproc_per_node 8 pipelines/evaluate_classifier.py shards/val --checkpoint ckpt.pt
    python pipelines/evaluate_classifier.py shards/val --checkpoint ckpt.pt --device cpu   # one process

``--checkpoint`` is what ``pipelines/train_classifier.py`` saves (model, architecture, class
names); a dataset whose class names differ from the checkpoint's is refused (its labels would
mean other classes), as is one of another class count for a checkpoint that saved only that.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torchvision

import shardkit
from shardkit import transforms
from shardkit.errors import ShardkitError

try:  # run as a script (python/torchrun pipelines/...): its directory is on the path
    import ddp
    import recipe_args
except ImportError:  # imported as pipelines.*
    from pipelines import ddp, recipe_args


def make_model(arch: str, num_classes: int) -> torch.nn.Module:
    """A torchvision classification model by name (``resnet18``, ``resnet50``, ...), untrained."""
    return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)


def val_loader(shards: str, *, batch_size: int, size: int, workers: int | str, device: torch.device,
               keys: bool = False) -> shardkit.ShardLoader:
    """The evaluation loader: centre crops, manifest order, each sample once over all ranks."""
    return shardkit.ShardLoader(
        shards,
        batch_size=batch_size,
        transform=transforms.imagenet_val(size, normalize=True, channels_last=device.type == "cuda"),
        num_workers=workers,
        device=device,
        shuffle=False,
        even_batches=False,  # no padding: ranks may differ by one batch, the last batch is short
        keys=keys,
    )


def evaluate(model: torch.nn.Module, loader: shardkit.ShardLoader, *, keys_log: Path | None = None) -> tuple[int, int]:
    """Top-1 ``(correct, total)`` summed over all ranks, each sample counted once.

    Pass the plain module, not the ``DistributedDataParallel`` wrapper: its forward may run
    collectives, which would wait forever on a rank that has one batch fewer. ``keys_log``:
    append each batch's sample keys to this file (one line per batch).
    """
    device = next(model.parameters()).device
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    was_training = model.training
    model.eval()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    with torch.no_grad(), autocast:
        for batch in loader:
            images, labels = batch[0], batch[1]
            counts[0] += (model(images).argmax(dim=1) == labels).sum()
            counts[1] += labels.numel()
            if keys_log is not None:
                with keys_log.open("a") as f:
                    f.write(" ".join(batch[2]) + "\n")
    model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(counts)  # one collective, after every rank's last batch
    return int(counts[0]), int(counts[1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser: argparse.ArgumentParser = recipe_args.RecipeParser(description=__doc__)
    parser.add_argument("shards", help="packed validation dataset (directory, index.json or URL)")
    parser.add_argument("--checkpoint", default=None,
                        help="train_classifier.py checkpoint to evaluate (default: an untrained model)")
    parser.add_argument("--arch", type=recipe_args.model_name("classification"), default=None,
                        help="torchvision model [default: the checkpoint's, else resnet18]")
    parser.add_argument("--batch-size", type=recipe_args.at_least(1), default=64, help="samples per batch per rank")
    parser.add_argument("--size", type=recipe_args.at_least(1), default=None,
                        help="side of the centre crop [default: the checkpoint's training --size, else 224]")
    recipe_args.add_eval_arguments(parser)
    args = parser.parse_args(argv)
    if args.checkpoint and not os.path.exists(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    recipe_args.check_device(args.device, parser)
    recipe_args.writable_folder(parser, "--log-keys", args.log_keys)

    rank, world, device = ddp.setup_distributed(args.device)
    try:
        keys_log = ddp.eval_keys_log(args.log_keys, rank)
        ddp.check_kind([args.shards], "imagefolder", "evaluate_classifier.py")
        ckpt = ddp.load_checkpoint(args.checkpoint, device=device, needs=("model", "arch", "num_classes"),
                                   written_by="train_classifier.py") if args.checkpoint else None
        size = args.size or (ckpt or {}).get("size", 224)  # a model scores at the size it was trained at
        if ckpt is not None:
            recipe_args.checkpoint_arch(parser, args.arch, args.checkpoint, ckpt["arch"])
        with val_loader(args.shards, batch_size=args.batch_size, size=size, workers=args.workers,
                        device=device, keys=keys_log is not None) as loader:
            arch, classes = args.arch or "resnet18", len(loader.manifest.classes or ())
            if ckpt is not None:
                why = ddp.class_difference(ckpt.get("classes", ckpt["num_classes"]), loader.classes, args.shards)
                if why is not None:  # a top-1 against labels that mean other classes would be a number, not a score
                    parser.exit(2, f"{parser.prog}: error: --checkpoint {args.checkpoint} was not trained on the "
                                   f"classes of {args.shards}: {why}\n")
                arch, classes = ckpt["arch"], ckpt["num_classes"]
            model = make_model(arch, classes).to(device)
            recipe_args.check_image_size(model, arch, size)
            if ckpt is not None:
                ddp.load_model_state(model, ckpt, args.checkpoint)
            if device.type == "cuda":
                model = model.to(memory_format=torch.channels_last)
            correct, total = evaluate(model, loader, keys_log=keys_log)
            batches = len(loader)
        if rank == 0:
            print(f"top-1 {correct / max(total, 1):.4f} ({correct}/{total} samples over {world} "
                  f"rank{'s' if world > 1 else ''}; {batches} batches on rank 0; {size}x{size} crops)", flush=True)
        return {"correct": correct, "total": total}
    except ShardkitError as err:  # shards that are not this task's, a dataset that is not there, ...
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
