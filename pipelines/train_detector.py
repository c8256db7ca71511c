"""Train a torchvision Faster R-CNN from packed COCO shards, with exact mid-epoch resume.

A recipe built only on shardkit's public API: ``ShardLoader`` with a detection transform and
contiguous labels (1..K, 0 = background), a small backbone (MobileNetV3-Large FPN, no
pretrained weights: nothing is downloaded), and the loader state saved in the same checkpoint as
the model so a restarted job continues with exactly the batches it had not seen.

    shardkit pack sample_data/coco/images --annotations sample_data/coco/instances.json shards/coco
    python pipelines/train_detector.py shards/coco --steps 50 --checkpoint det.pt
    python pipelines/train_detector.py shards/coco --steps 100 --checkpoint det.pt  # resumes at 50

Crowd boxes are trained on as ordinary boxes, as torchvision's v2 detection references do.
Works on CPU (tiny sizes for a smoke test) and on CUDA.
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
    loader = shardkit.ShardLoader(
        args.shards,
        batch_size=args.batch_size,
        transform=transforms.detection_train(min_size=args.size, max_size=2 * args.size,
                                             iou_crop=args.iou_crop),
        contiguous_labels=True,
        num_workers=args.workers,
        device=args.device,
        seed=args.seed,
        drop_last=True,
    )
    num_classes = len(loader.label_map or {}) + 1
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=num_classes, min_size=args.size,
        max_size=2 * args.size,
    ).to(args.device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
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
    model.train()
    loss_value, seen, started = float("nan"), 0, time.perf_counter()
    while step < args.steps:
        for images, targets in loader:
            inputs = [im.float().div_(255) for im in images]
            losses = model(inputs, [{"boxes": t["boxes"], "labels": t["labels"]} for t in targets])
            loss = sum(losses.values())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, seen, loss_value = step + 1, seen + len(images), loss.item()
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
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, default=320, help="shorter side (the model's min_size)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-iou-crop", dest="iou_crop", action="store_false",
                        help="skip RandomIoUCrop")
    parser.add_argument("--checkpoint", default=None,
                        help="save here at the end; resume from it if present")
    result = train(parser.parse_args(argv))
    print(f"step {result['step']}  loss {result['loss']:.3f}  {result['images_per_second']:.1f} "
          "images/s")


if __name__ == "__main__":
    main()
