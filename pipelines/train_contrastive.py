"""Train a CLIP-style image-text model from packed captioned shards under torchrun (DDP), with exact
mid-epoch resume.

A recipe built only on shardkit's public API. The loader yields ``(images, token ids)``: the
captions are tokenized in the worker processes (``text_transform``), so the training loop only
runs the two encoders and the symmetric contrastive loss (InfoNCE over the global batch: every
rank's embeddings are gathered, with their gradients). Checkpoints hold model + optimizer +
loader state; run the same command again to continue with exactly the batches not trained on.

    shardkit pack pairs.parquet shards/pairs
    torchrun --nproc_per_node 8 pipelines/train_contrastive.py shards/pairs --epochs 32 \\
        --checkpoint ckpt.pt --checkpoint-every 500

    python pipelines/train_contrastive.py shards/pairs --steps 10 --size 64 --batch-size 16 --device cpu

The tokenizer here is UTF-8 bytes (256 ids, no vocabulary file); pass the model's own by editing
:class:`shardkit.transforms.ByteTokenizer` out (any callable ``list[str] -> LongTensor [B, L]`` works as
``text_transform``). Several datasets train as one mix (``--weights``), as in
``train_classifier.py``. On CUDA: NCCL, bf16 autocast, channels_last, ``--compile``;
``--share-steps N`` ends the run with its fed-step share (``step_share.py``), as the classifier
recipe does.
"""

from __future__ import annotations

import argparse
import math
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

try:  # run as a script: its directory is on the path
    import ddp
    import recipe_args
    import step_share
except ImportError:  # imported as pipelines.train_contrastive
    from pipelines import ddp, recipe_args, step_share


class TextEncoder(torch.nn.Module):
    """Mean of byte embeddings (padding left out), then a linear projection."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(257, dim, mode="mean", padding_idx=0)
        self.project = torch.nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.project(self.embed(ids))


class Clip(torch.nn.Module):
    """A torchvision image model with its head replaced by a ``dim`` projection, a text encoder
    and a learnable temperature (CLIP's initial 1/0.07)."""

    def __init__(self, arch: str, dim: int) -> None:
        super().__init__()
        import torchvision

        self.image = torchvision.models.get_model(arch, num_classes=dim)
        self.text = TextEncoder(dim)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        image = torch.nn.functional.normalize(self.image(images), dim=-1)
        text = torch.nn.functional.normalize(self.text(ids), dim=-1)
        return image, text


class _GatherRows(torch.autograd.Function):
    """Every rank's rows, concatenated in rank order, with their gradients: the backward pass sums
    each slice's gradient over the ranks (every rank's loss uses every rank's embeddings) and
    returns this rank's."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor) -> torch.Tensor:
        gathered = rows.new_empty((dist.get_world_size() * rows.shape[0], *rows.shape[1:]))
        dist.all_gather_into_tensor(gathered, rows.contiguous())
        return gathered

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad.chunk(dist.get_world_size())[dist.get_rank()]


def contrastive_loss(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE over the global batch (this rank's rows against every rank's)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if world > 1:
        all_image, all_text = _GatherRows.apply(image), _GatherRows.apply(text)
    else:
        all_image, all_text = image, text
    scale = logit_scale.exp().clamp(max=100)
    targets = torch.arange(len(image), device=image.device) + rank * len(image)
    per_image = torch.nn.functional.cross_entropy(scale * image @ all_text.T, targets)
    per_text = torch.nn.functional.cross_entropy(scale * text @ all_image.T, targets)
    return (per_image + per_text) / 2


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train for ``args.epochs`` epochs (or until ``args.steps`` steps); return the last figures."""
    rank, world, device = ddp.setup_distributed(args.device)
    cuda = device.type == "cuda"
    log_dir = Path(args.log_keys) if args.log_keys else None
    samples = ddp.check_kind(args.shards, "captions", "train_contrastive.py")
    ddp.require_batches(sum(samples[url] for url in args.shards), args.batch_size, world, args.shards)
    loader = shardkit.ShardLoader(
        **args.dataset,
        batch_size=args.batch_size,
        transform=transforms.imagenet_train(args.size, scale=(0.5, 1.0), normalize=True),
        text_transform=transforms.ByteTokenizer(args.context_length),
        num_workers=args.workers,
        device=device,
        feeders=args.feeders,
        seed=args.seed,
        drop_last=True,  # full batches on every rank: the same number of steps everywhere
        keys=log_dir is not None,
    )
    model = Clip(args.arch, args.dim).to(device)
    recipe_args.check_image_size(model.image, args.arch, args.size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    step = ddp.resume(args.checkpoint, model=model, optimizer=optimizer, loader=loader, device=device, rank=rank,
                      arch=args.arch)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    net: torch.nn.Module = DistributedDataParallel(model, device_ids=[device.index] if cuda else None) \
        if world > 1 else model
    if args.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def checkpoint() -> None:
        if rank == 0 and args.checkpoint:
            ddp.save_checkpoint(args.checkpoint, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                                  "loader": loader.state_dict(), "step": step, "arch": args.arch,
                                                  "dim": args.dim})

    def train_step(images: torch.Tensor, ids: torch.Tensor) -> float:
        with autocast:
            image, text = net(images, ids)
            loss = contrastive_loss(image.float(), text.float(), model.logit_scale)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    loss_value, seen, started = float("nan"), 0, time.perf_counter()
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
            images, ids = batch[0], batch[1]
            step, seen, loss_value = step + 1, seen + len(ids), train_step(images, ids)
            clock.tick((images, ids) if args.share_steps else None)
            if log_dir is not None:
                with (log_dir / f"train-rank{rank}.txt").open("a") as f:
                    f.write(f"{step} {' '.join(batch[2])}\n")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint()
            if progress.due(step) and rank == 0:
                elapsed = time.perf_counter() - started
                print(f"step {step}  epoch {epoch}  loss {loss_value:.3f}  {seen * world / elapsed:.0f} pairs/s  "
                      f"data wait {100 * loader.stats.wait_s / elapsed:.0f}%", flush=True)
            if step == args.stop_after_steps:  # a preemption, for testing resume: no cleanup, no save
                os.kill(os.getpid(), signal.SIGKILL)
            if args.steps and step >= args.steps:
                done = True
                break
    checkpoint()
    elapsed = time.perf_counter() - started
    result = {"step": step, "loss": loss_value, "pairs_per_second": seen * world / elapsed,
              "data_wait": loader.stats.wait_s / elapsed}
    if rank == 0 and seen:
        print(f"done: step {step}  loss {loss_value:.3f}  {result['pairs_per_second']:.0f} pairs/s  "
              f"data wait {100 * result['data_wait']:.0f}%", flush=True)
    if args.share_steps:  # after the last checkpoint: these steps change no saved state
        result["step_share"] = step_share.report_share(train_step, clock, args.batch_size * world, show=rank == 0)
    ddp.finish(loader)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = recipe_args.RecipeParser(description=__doc__)
    ddp.add_dataset_arguments(parser, "captioned dataset")
    parser.add_argument("--arch", type=recipe_args.model_name("classification"), default="resnet18",
                        help="torchvision image model (its head becomes the projection)")
    parser.add_argument("--dim", type=recipe_args.at_least(1), default=256, help="embedding size")
    parser.add_argument("--context-length", type=recipe_args.at_least(1), default=77, help="tokens per caption (bytes)")
    parser.add_argument("--batch-size", type=recipe_args.at_least(1), default=64, help="pairs per batch per rank")
    parser.add_argument("--size", type=recipe_args.at_least(1), default=224, help="side of the training crops")
    parser.add_argument("--lr", type=recipe_args.positive_float, default=5e-4, help="AdamW learning rate")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--feeders", type=recipe_args.count_or_auto, default="auto",
                        help="processes that decode and augment outside the training process on the GPU route, "
                             "sharing the workers ('auto': one per 5 workers; 0: none)")
    recipe_args.add_run_arguments(parser, log_every=50)
    step_share.add_share_argument(parser)
    return ddp.run_training(parser, argv, train)


if __name__ == "__main__":
    main()
