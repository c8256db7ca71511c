"""Train an image classifier from packed shards, with exact mid-epoch resume.

A recipe built only on shardkit's public API: ``ShardLoader`` + ``transforms`` presets, with the
loader state saved in the same checkpoint as the model so a restarted job continues with exactly
the batches it had not seen.

    python pipelines/train_classifier.py SHARDS --steps 50 --checkpoint ckpt.pt
    python pipelines/train_classifier.py SHARDS --steps 100 --checkpoint ckpt.pt  # resumes at 50

Works on CPU (tiny steps for a smoke test) and on CUDA (bf16 autocast, channels_last).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torchvision

import shardkit
from shardkit import transforms


def build(args: argparse.Namespace) -> tuple[shardkit.ShardLoader, torch.nn.Module,
                                             torch.optim.Optimizer]:
    cuda = args.device.startswith("cuda")
    loader = shardkit.ShardLoader(
        args.shards,
        batch_size=args.batch_size,
        transform=transforms.imagenet_train(args.size, normalize=True, channels_last=cuda),
        num_workers=args.workers,
        device=args.device,
        seed=args.seed,
        drop_last=True,
    )
    num_classes = len(loader.manifest.classes or ())
    model = torchvision.models.resnet18(num_classes=num_classes).to(args.device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return loader, model, optimizer


def train(args: argparse.Namespace) -> dict[str, float]:
    """Run until ``args.steps`` optimizer steps in total; return the last loss and throughput."""
    loader, model, optimizer = build(args)
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location=args.device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        step = ckpt["step"]
    loss_value, seen, started = float("nan"), 0, time.perf_counter()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device.startswith("cuda"))
    while step < args.steps:
        for images, labels in loader:
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, seen, loss_value = step + 1, seen + len(labels), loss.item()
            if step >= args.steps:
                break
    if args.checkpoint:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(), "step": step}, args.checkpoint)
    return {"step": step, "loss": loss_value,
            "images_per_second": seen / (time.perf_counter() - started)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None,
                        help="save here at the end; resume from it if present")
    result = train(parser.parse_args(argv))
    print(f"step {result['step']}  loss {result['loss']:.3f}  {result['images_per_second']:.0f} "
          "images/s")


if __name__ == "__main__":
    main()
