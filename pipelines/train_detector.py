"""Train a torchvision detector from packed COCO shards under torchrun (DDP), with exact mid-epoch resume.

A recipe built only on shardkit's public API: ``ShardLoader`` with
``transforms.detection_train(min_size, max_size)`` and contiguous labels (1..K, 0 = background),
a small untrained detector by default (Faster R-CNN, MobileNetV3-Large FPN: nothing is
downloaded). Each rank's loader takes its rank and world size from the process group and yields
the same number of batches (no DDP hang); every ``--checkpoint-every`` steps rank 0 saves model +
optimizer + loader state in one file (written atomically), so a preempted job loses at most that
many steps: run the same command again and it continues with exactly the batches it had not
trained on. ``--val`` evaluates after each epoch: COCO box mAP (pycocotools' COCOeval) with
``detection_val(min_size, max_size)`` and ``even_batches=False``, each image once over all ranks
(see ``evaluate_detector.py``).

    shardkit pack coco/train2017 --annotations coco/annotations/instances_train2017.json shards/coco-train
    torchrun --nproc_per_node 8 pipelines/train_detector.py shards/coco-train --val shards/coco-val \\
        --epochs 26 --checkpoint det.pt --checkpoint-every 500
    # preempted? the same command resumes from det.pt

    shardkit pack sample_data/coco/images --annotations sample_data/coco/instances.json shards/coco
    python pipelines/train_detector.py shards/coco --val shards/coco --epochs 2 --batch-size 4 \\
        --min-size 128 --max-size 256 --device cpu   # one process, a smoke test

On CUDA: NCCL, bf16 autocast, channels_last, ``--compile`` (the backbone), and the loaders take
the COCO GPU route (workers ship JPEG bytes and the seeded IoU crop, size and flip; nvJPEG decode
and the crop-resize-flip run on the GPU; boxes and labels are the CPU route's). On CPU: gloo
(tests run it so). Crowd boxes are trained on as ordinary boxes, as torchvision's v2 detection
references do.
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

try:  # run as a script (python/torchrun pipelines/train_detector.py): its directory is on the path
    import ddp
    import recipe_args
    import step_share
    from evaluate_detector import describe, evaluate, make_model, val_loader
except ImportError:  # imported as pipelines.train_detector
    from pipelines import ddp, recipe_args, step_share
    from pipelines.evaluate_detector import describe, evaluate, make_model, val_loader


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train for ``args.epochs`` epochs (or until ``args.steps`` steps); return the last figures."""
    rank, world, device = ddp.setup_distributed(args.device)
    cuda = device.type == "cuda"
    log_dir = Path(args.log_keys) if args.log_keys else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    samples = ddp.check_kind([*args.shards, *([args.val] if args.val else [])], "coco", "train_detector.py")
    ddp.require_batches(sum(samples[url] for url in args.shards), args.batch_size, world, args.shards)
    loader = shardkit.ShardLoader(
        **args.dataset,
        batch_size=args.batch_size,
        transform=transforms.detection_train(args.min_size, args.max_size, iou_crop=args.iou_crop),
        contiguous_labels=True,  # labels 1..K (0: background), the model's classes
        num_workers=args.workers,
        device=device,
        seed=args.seed,
        drop_last=True,  # full batches, every image at most once per epoch, equal on every rank
        keys=log_dir is not None,
    )  # rank and world size: from the process group
    val = (val_loader(args.val, batch_size=args.batch_size, min_size=args.min_size, max_size=args.max_size,
                      workers=args.workers, device=device) if args.val else None)
    if val is not None and val.label_map != loader.label_map:
        raise shardkit.ShardkitError(f"--val {args.val} and {' + '.join(args.shards)} have different categories: "
                                     "labels would not match")
    num_classes = len(loader.label_map or {}) + 1  # + background
    model = make_model(args.arch, num_classes, args.min_size, args.max_size).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    step = ddp.resume(args.checkpoint, model=model, optimizer=optimizer, loader=loader, device=device, rank=rank,
                      arch=args.arch)
    net: torch.nn.Module = model
    if world > 1:
        net = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    if args.compile:
        # The backbone holds the dense work; the heads' data-dependent ops (NMS, sampling) stay eager.
        # Module.compile() compiles in place, so the checkpoint's parameter names do not change.
        model.backbone.compile()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def checkpoint() -> None:
        if rank == 0 and args.checkpoint:
            ddp.save_checkpoint(args.checkpoint, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict(),
                "step": step, "arch": args.arch, "num_classes": num_classes, "label_map": loader.label_map,
                "classes": loader.classes, "min_size": args.min_size, "max_size": args.max_size,
            })

    losses: dict[str, torch.Tensor] = {}

    def train_step(images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]) -> float:
        nonlocal losses
        inputs = [im.float().div_(255) for im in images]
        with autocast:
            losses = net(inputs, [{"boxes": t["boxes"], "labels": t["labels"]} for t in targets])
        loss = torch.stack([v.float() for v in losses.values()]).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    loss_value, seen, started, metrics = float("nan"), 0, time.perf_counter(), None
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
            images, targets = batch[0], batch[1]
            step, seen, loss_value = step + 1, seen + len(images), train_step(images, targets)
            clock.tick((images, targets) if args.share_steps else None)
            if log_dir is not None:
                with (log_dir / f"train-rank{rank}.txt").open("a") as f:
                    f.write(f"{step} {' '.join(batch[2])}\n")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint()
            if progress.due(step) and rank == 0:
                elapsed = time.perf_counter() - started
                parts = "  ".join(f"{k.removeprefix('loss_')} {v.item():.3f}" for k, v in losses.items())
                print(f"step {step}  epoch {epoch}  loss {loss_value:.3f} ({parts})  "
                      f"{seen * world / elapsed:.1f} images/s  data wait {100 * loader.stats.wait_s / elapsed:.0f}%",
                      flush=True)
            if step == args.stop_after_steps:  # a preemption, for testing resume: no cleanup, no save
                os.kill(os.getpid(), signal.SIGKILL)
            if args.steps and step >= args.steps:
                done = True
                break
        if val is not None and not done:
            metrics = evaluate(model, val)  # the plain module: ranks may differ by one batch
            if rank == 0:
                print(f"epoch {epoch}  {describe(metrics, world)}", flush=True)
    if val is not None and done and seen:  # --steps ended the run: evaluate what it trained
        metrics = evaluate(model, val)
        if rank == 0:
            print(f"step {step}  {describe(metrics, world)}", flush=True)
    checkpoint()
    elapsed = time.perf_counter() - started
    result = {"step": step, "loss": loss_value, "images_per_second": seen * world / elapsed,
              "data_wait": loader.stats.wait_s / elapsed, "val": metrics}
    if rank == 0 and seen:
        print(f"done: step {step}  loss {loss_value:.3f}  {result['images_per_second']:.1f} images/s  "
              f"data wait {100 * result['data_wait']:.0f}%", flush=True)
    if args.share_steps:  # after the last checkpoint: these steps change no saved state
        result["step_share"] = step_share.report_share(train_step, clock, args.batch_size * world, show=rank == 0)
    ddp.finish(loader, val)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = recipe_args.RecipeParser(description=__doc__)
    ddp.add_dataset_arguments(parser, "COCO training dataset")
    parser.add_argument("--val", default=None, help="packed COCO validation dataset: box mAP after each epoch")
    parser.add_argument("--arch", type=recipe_args.model_name("detection"),
                        default="fasterrcnn_mobilenet_v3_large_320_fpn",
                        help="torchvision detection model taking min_size/max_size (Faster R-CNN, RetinaNet, FCOS)")
    parser.add_argument("--batch-size", type=recipe_args.at_least(1), default=8, help="images per batch per rank")
    parser.add_argument("--min-size", type=recipe_args.at_least(1), default=320,
                        help="shorter side of the training and evaluation images (the model's min_size)")
    parser.add_argument("--max-size", type=recipe_args.at_least(1), default=640,
                        help="longer side at most (the model's max_size)")
    parser.add_argument("--no-iou-crop", dest="iou_crop", action="store_false",
                        help="train without RandomIoUCrop (default: with it)")
    parser.add_argument("--lr", type=recipe_args.positive_float, default=0.02, help="SGD learning rate")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model's backbone")
    recipe_args.add_run_arguments(parser, log_every=20)
    step_share.add_share_argument(parser)
    return ddp.run_training(parser, argv, train,
                            check=lambda args: recipe_args.check_sizes(parser, args.min_size, args.max_size))


if __name__ == "__main__":
    main()
