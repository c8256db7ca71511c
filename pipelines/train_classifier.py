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

On CUDA: NCCL, bf16 autocast, channels_last, ``--compile``. On CPU: gloo (tests run it so).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import shardkit
from shardkit import transforms

try:  # run as a script (python/torchrun pipelines/train_classifier.py): its directory is on the path
    from evaluate_classifier import evaluate, make_model, setup_distributed, val_loader
except ImportError:  # imported as pipelines.train_classifier
    from pipelines.evaluate_classifier import evaluate, make_model, setup_distributed, val_loader


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a job killed while saving keeps the previous one."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train for ``args.epochs`` epochs (or until ``args.steps`` steps); return the last figures."""
    rank, world, device = setup_distributed(args.device)
    cuda = device.type == "cuda"
    log_dir = Path(args.log_keys) if args.log_keys else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    loader = shardkit.ShardLoader(
        args.shards,
        batch_size=args.batch_size,
        transform=transforms.imagenet_train(args.size, normalize=True, channels_last=cuda),
        num_workers=args.workers,
        device=device,
        seed=args.seed,
        drop_last=True,  # full batches, every sample at most once per epoch, equal on every rank
        keys=log_dir is not None,
    )  # rank and world size: from the process group
    val = (val_loader(args.val, batch_size=args.batch_size, size=args.size, workers=args.workers, device=device)
           if args.val else None)
    num_classes = len(loader.manifest.classes or ())
    model = make_model(args.arch, num_classes).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # refuses a state made for another world size or batch size
        step = ckpt["step"]
        if rank == 0:
            print(f"resumed from {args.checkpoint}: step {step}, epoch {loader.epoch}, "
                  f"batch {loader.state_dict()['batches_consumed']} of {len(loader)}", flush=True)
    net: torch.nn.Module = model
    if world > 1:
        net = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    if args.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def checkpoint() -> None:
        if rank == 0 and args.checkpoint:
            save_checkpoint(args.checkpoint, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict(),
                "step": step, "arch": args.arch, "num_classes": num_classes,
            })

    loss_value, seen, started, accuracy = float("nan"), 0, time.perf_counter(), None
    done = bool(args.steps) and step >= args.steps
    for epoch in range(loader.epoch, args.epochs):
        if done:
            break
        loader.set_epoch(epoch)  # right after load_state_dict: keeps the resume point
        net.train()
        for batch in loader:
            images, labels = batch[0], batch[1]
            with autocast:
                loss = torch.nn.functional.cross_entropy(net(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, seen, loss_value = step + 1, seen + len(labels), loss.item()
            if log_dir is not None:
                with (log_dir / f"train-rank{rank}.txt").open("a") as f:
                    f.write(f"{step} {' '.join(batch[2])}\n")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint()
            if rank == 0 and args.log_every and step % args.log_every == 0:
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
    checkpoint()
    elapsed = time.perf_counter() - started
    result = {"step": step, "loss": loss_value, "images_per_second": seen * world / elapsed,
              "data_wait": loader.stats.wait_s / elapsed, "top1": accuracy}
    if rank == 0:
        print(f"step {step}  loss {loss_value:.3f}  {result['images_per_second']:.0f} images/s  "
              f"data wait {100 * result['data_wait']:.0f}%", flush=True)
    loader.close()
    if val is not None:
        val.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="packed training dataset (directory, index.json or URL)")
    parser.add_argument("--val", default=None, help="packed validation dataset: top-1 after each epoch")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train in total")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps in total (0: no limit)")
    parser.add_argument("--arch", default="resnet18", help="torchvision classification model")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch per rank")
    parser.add_argument("--size", type=int, default=224, help="side of the training crops")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes per rank")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (under torchrun each rank takes GPU LOCAL_RANK)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the loader's order and augmentation")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file: resume from it if present, save to it")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="save every N steps (a preempted job loses at most N); 0: only at the end")
    parser.add_argument("--log-every", type=int, default=50, help="print loss and throughput every N steps; 0: never")
    parser.add_argument("--log-keys", default=None, metavar="DIR",
                        help="append each step's sample keys to DIR/train-rank<R>.txt (to audit epochs)")
    parser.add_argument("--stop-after-steps", type=int, default=0,
                        help="testing: SIGKILL every rank after this step, as a preemption would (0: never)")
    return train(parser.parse_args(argv))


if __name__ == "__main__":
    main()
