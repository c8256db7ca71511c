"""Train an image classifier from packed shards under torchrun (DDP), with exact mid-epoch resume.

A recipe built only on shardkit's public API. Each rank's ``ShardLoader`` takes its rank and world
size from the process group and yields the same number of batches (no DDP hang); every
``--checkpoint-every`` steps rank 0 saves model + optimizer + loader state in one file (written
atomically), so a preempted job loses at most that many steps: run the same command again and
it continues with exactly the batches it had not trained on. ``--val`` evaluates after each
epoch with ``even_batches=False`` (each validation sample counted once, see
``evaluate_classifier.py``).

    torchrun --nproc_per_node 8 pipelines/train_classifier.py shards/train --val shards/val \\
        --epochs 90 --checkpoint ckpt.pt --checkpoint-every 500
    # preempted? the same command resumes from ckpt.pt

    python pipelines/train_classifier.py shards/train --epochs 1 --size 32 --batch-size 8 --device cpu

Several datasets train as one mix (``ShardLoader``'s ``weights``: each one's share of an epoch,
exact and resumable like one dataset; their class lists must be equal)::

    torchrun --nproc_per_node 8 pipelines/train_classifier.py shards/a shards/b --weights 0.7 0.3

``--disjoint-labels`` mixes datasets of different classes instead: each keeps its own, one after
another. The checkpoint saves the class names; ``evaluate_classifier.py`` refuses a dataset of
other ones, and so does a resume.

On CUDA: NCCL, bf16 autocast, channels_last, ``--compile``. On CPU: gloo (tests run it so).
``--share-steps N`` ends the run with its fed-step share (``step_share.py``): the images/s of its
last N steps over that of N steps on one batch already on the device.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

import shardkit
from shardkit import transforms

try:  # run as a script (python/torchrun pipelines/train_classifier.py): its directory is on the path
    import ddp
    import recipe_args
    import step_share
    from evaluate_classifier import evaluate, make_model, val_loader
except ImportError:  # imported as pipelines.train_classifier
    from pipelines import ddp, recipe_args, step_share
    from pipelines.evaluate_classifier import evaluate, make_model, val_loader


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train for ``args.epochs`` epochs (or until ``args.steps`` steps); return the last figures."""
    rank, world, device = ddp.setup_distributed(args.device)
    cuda = device.type == "cuda"
    log_dir = Path(args.log_keys) if args.log_keys else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    samples = ddp.check_kind([*args.shards, *([args.val] if args.val else [])], "imagefolder", "train_classifier.py")
    ddp.require_batches(sum(samples[url] for url in args.shards), args.batch_size, world, args.shards)
    loader = shardkit.ShardLoader(
        **args.dataset,
        batch_size=args.batch_size,
        transform=transforms.imagenet_train(args.size, normalize=True, channels_last=cuda),
        num_workers=args.workers,
        device=device,
        seed=args.seed,
        drop_last=True,  # full batches, every sample at most once per epoch, equal on every rank
        keys=log_dir is not None,
        feeders=args.feeders,
    )  # rank and world size: from the process group
    val = (val_loader(args.val, batch_size=args.batch_size, size=args.size, workers=args.workers, device=device)
           if args.val else None)
    classes = list(loader.classes or ())  # a mix with --disjoint-labels: each dataset's, one after another
    num_classes = len(classes)
    why = ddp.class_difference(classes, val.classes, args.val, saved_in="training") if val is not None else None
    if why is not None:  # a top-1 against labels of other classes would be a number, not a score
        raise shardkit.ShardkitError(f"--val {args.val} is not of the training classes: {why}")
    model = make_model(args.arch, num_classes).to(device)
    recipe_args.check_image_size(model, args.arch, args.size)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    step = ddp.resume(args.checkpoint, model=model, optimizer=optimizer, loader=loader, device=device, rank=rank,
                      arch=args.arch)
    net: torch.nn.Module = model
    if world > 1:
        net = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    if args.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def checkpoint() -> None:
        if rank == 0 and args.checkpoint:
            ddp.save_checkpoint(args.checkpoint, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict(),
                "step": step, "arch": args.arch, "num_classes": num_classes,
                "classes": classes,  # evaluate_classifier.py refuses data of other classes
                "size": args.size,  # and evaluates at this size unless told otherwise
            })

    def train_step(images: torch.Tensor, labels: torch.Tensor) -> float:
        with autocast:
            loss = torch.nn.functional.cross_entropy(net(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    loss_value, seen, started, accuracy = float("nan"), 0, time.perf_counter(), None
    clock = step_share.StepClock(args.share_steps)
    progress = ddp.ProgressClock(args.log_every)
    done = bool(args.steps) and step >= args.steps
    if (done or loader.epoch >= args.epochs) and rank == 0:
        print(f"nothing to train: the checkpoint is at step {step}, epoch {loader.epoch} "
              f"(--steps {args.steps or 'unlimited'}, --epochs {args.epochs})", flush=True)
    for epoch in range(loader.epoch, args.epochs):
        if done:
            break
        loader.set_epoch(epoch)  # right after load_state_dict: keeps the resume point
        net.train()
        for batch in loader:
            images, labels = batch[0], batch[1]
            step, seen, loss_value = step + 1, seen + len(labels), train_step(images, labels)
            clock.tick((images, labels) if args.share_steps else None)
            if log_dir is not None:
                with (log_dir / f"train-rank{rank}.txt").open("a") as f:
                    f.write(f"{step} {' '.join(batch[2])}\n")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint()
            if progress.due(step) and rank == 0:
                elapsed = time.perf_counter() - started
                print(f"step {step}  epoch {epoch}  loss {loss_value:.3f}  {seen * world / elapsed:.0f} images/s  "
                      f"data wait {100 * loader.stats.wait_s / elapsed:.0f}%", flush=True)
            if step == args.stop_after_steps:  # a preemption, for testing resume: no cleanup, no save
                os.kill(os.getpid(), signal.SIGKILL)
            if args.steps and step >= args.steps:
                done = True
                break
        if val is not None and not done:
            correct, total = evaluate(model, val)  # the plain module: ranks may differ by one batch
            accuracy = correct / max(total, 1)
            if rank == 0:
                print(f"epoch {epoch}  top-1 {accuracy:.4f} ({correct}/{total})", flush=True)
    if val is not None and done and seen:  # --steps ended the run: evaluate what it trained
        correct, total = evaluate(model, val)
        accuracy = correct / max(total, 1)
        if rank == 0:
            print(f"step {step}  top-1 {accuracy:.4f} ({correct}/{total})", flush=True)
    checkpoint()
    elapsed = time.perf_counter() - started
    result = {"step": step, "loss": loss_value, "images_per_second": seen * world / elapsed,
              "data_wait": loader.stats.wait_s / elapsed, "top1": accuracy}
    if rank == 0 and seen:
        print(f"done: step {step}  loss {loss_value:.3f}  {result['images_per_second']:.0f} images/s  "
              f"data wait {100 * result['data_wait']:.0f}%", flush=True)
    if args.share_steps:  # after the last checkpoint: these steps change no saved state
        result["step_share"] = step_share.report_share(train_step, clock, args.batch_size * world, show=rank == 0)
    ddp.finish(loader, val)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = recipe_args.RecipeParser(description=__doc__)
    ddp.add_dataset_arguments(parser, "training dataset", disjoint=True)
    parser.add_argument("--val", default=None, help="packed validation dataset: top-1 after each epoch")
    parser.add_argument("--arch", type=recipe_args.model_name("classification"), default="resnet18",
                        help="torchvision classification model")
    parser.add_argument("--batch-size", type=recipe_args.at_least(1), default=32, help="samples per batch per rank")
    parser.add_argument("--size", type=recipe_args.at_least(1), default=224, help="side of the training crops")
    parser.add_argument("--lr", type=recipe_args.positive_float, default=0.05, help="SGD learning rate")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--feeders", type=recipe_args.count_or_auto, default="auto",
                        help="processes that decode and augment outside the training process on the GPU route, "
                             "sharing the workers ('auto': one per 5 workers; 0: none)")
    recipe_args.add_run_arguments(parser, log_every=50)
    step_share.add_share_argument(parser)
    return ddp.run_training(parser, argv, train)


if __name__ == "__main__":
    main()
