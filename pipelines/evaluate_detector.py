"""Evaluate a detector on packed COCO shards under torchrun: COCO box mAP with each image once.

The loader is built with ``transforms.detection_val(min_size, max_size)`` and
``even_batches=False``: over all ranks every image is delivered exactly once, the last batch is
short and ranks may hold one batch more than others. So no collective runs per batch; each rank
keeps its images' ground truth and detections, one ``gather_object`` after the loop brings them
to rank 0, and rank 0 scores them with ``pycocotools.cocoeval.COCOeval`` (``iouType="bbox"``,
the COCO protocol: AP over IoU 0.50:0.95, 100 detections per image, crowd boxes ignored).

What it reports: AP, AP50 and AP75 (plus the full COCOeval table when run as a script), the
number of images, ground-truth boxes and detections (detections per image). Ground truth and
detections are compared at the evaluated size (shorter side ``--min-size``), so the
small/medium/large area ranges refer to boxes at that size, not at the original one; the
all-area AP is what the resize changes least. Without pycocotools only the counts are reported.

    torchrun --nproc_per_node 8 pipelines/evaluate_detector.py shards/coco-val --checkpoint det.pt
    python pipelines/evaluate_detector.py shards/coco-val --checkpoint det.pt --device cpu   # one process

``--checkpoint`` is what ``pipelines/train_detector.py`` saves (model, architecture, label map).
"""

from __future__ import annotations

import argparse
import contextlib
import io
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

#: COCOeval's ``stats`` in order (``summarize()``), for the returned dictionary.
COCO_STATS = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large",
              "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large")


def make_model(arch: str, num_classes: int, min_size: int, max_size: int) -> torch.nn.Module:
    """A torchvision detection model by name, untrained (nothing downloaded), resizing its inputs
    to ``min_size``/``max_size`` (the loader's sizes, so its own resize is a no-op).

    ``num_classes`` counts the background: K categories + 1."""
    return torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=num_classes,
                                        min_size=min_size, max_size=max_size)


def val_loader(shards: str, *, batch_size: int, min_size: int, max_size: int, workers: int | str,
               device: torch.device, keys: bool = False) -> shardkit.ShardLoader:
    """The evaluation loader: resized as the model does, manifest order, each image once over all ranks."""
    return shardkit.ShardLoader(
        shards,
        batch_size=batch_size,
        transform=transforms.detection_val(min_size, max_size),
        contiguous_labels=True,  # labels 1..K as the model's classes (0: background)
        num_workers=workers,
        device=device,
        shuffle=False,
        even_batches=False,  # no padding: ranks may differ by one batch, the last batch is short
        keys=keys,
    )


def coco_map(records: list[dict[str, Any]], num_classes: int) -> tuple[list[float], str]:
    """Score ``records`` (one per image: ground truth and detections) with pycocotools' COCOeval.

    Returns COCOeval's 12 ``stats`` (-1 where there is no ground truth to score) and its
    printed summary table."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(boxes: torch.Tensor) -> list[list[float]]:
        b = boxes.double()
        return torch.stack([b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], dim=1).tolist()

    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    detections: list[dict[str, Any]] = []
    for r in records:
        images.append({"id": r["image_id"], "height": r["size"][0], "width": r["size"][1]})
        for box, label, crowd in zip(xywh(r["boxes"]), r["labels"].tolist(), r["iscrowd"].tolist(), strict=True):
            annotations.append({"id": len(annotations) + 1, "image_id": r["image_id"], "category_id": label,
                                "bbox": box, "area": box[2] * box[3], "iscrowd": crowd})
        for box, label, score in zip(xywh(r["pred_boxes"]), r["pred_labels"].tolist(), r["scores"].tolist(),
                                     strict=True):
            detections.append({"image_id": r["image_id"], "category_id": label, "bbox": box, "score": score})
    if not detections:  # COCO.loadRes refuses an empty list; nothing detected scores 0 (or -1: no ground truth)
        return [0.0 if annotations else -1.0] * len(COCO_STATS), ""
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # pycocotools prints progress; keep only the summary table
        gt = COCO()
        gt.dataset = {"images": images, "annotations": annotations,
                      "categories": [{"id": k} for k in range(1, num_classes)]}
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(detections), iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    table = "\n".join(line for line in log.getvalue().splitlines() if line.startswith(" Average"))
    return [float(s) for s in evaluator.stats], table


def evaluate(model: torch.nn.Module, loader: shardkit.ShardLoader, *, keys_log: Path | None = None) -> dict[str, Any]:
    """Detect on every image of ``loader`` once over all ranks; return the same figures on every rank.

    ``images``, ``boxes`` (ground truth), ``detections``, ``detections_per_image`` and, with
    pycocotools installed, the COCOeval ``stats`` by name (``AP``, ``AP50``, ...) and ``table``;
    ``duplicates``: images seen more than once (0 unless the loader pads).

    Pass the plain module, not the ``DistributedDataParallel`` wrapper: its forward may run
    collectives, which would wait forever on a rank that has one batch fewer. ``keys_log``:
    append each batch's sample keys to this file (one line per batch).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    records: list[dict[str, Any]] = []
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    with torch.no_grad():
        for batch in loader:
            images, targets = batch[0], batch[1]
            with autocast:
                outputs = model([im.float().div_(255) for im in images])
            for image, target, out in zip(images, targets, outputs, strict=True):
                if isinstance(target["image_id"], str):  # gathered over ranks as numbers, as COCO's ids are
                    raise ShardkitError(f"image id {target['image_id']!r} is a string: this evaluation takes "
                                        "COCO's integer image ids")
                records.append({
                    "image_id": int(target["image_id"]), "size": tuple(image.shape[-2:]),
                    "boxes": target["boxes"].cpu(), "labels": target["labels"].cpu(),
                    "iscrowd": target["iscrowd"].cpu(), "pred_boxes": out["boxes"].float().cpu(),
                    "pred_labels": out["labels"].cpu(), "scores": out["scores"].float().cpu(),
                })
            if keys_log is not None:
                with keys_log.open("a") as f:
                    f.write(" ".join(batch[2]) + "\n")
    model.train(was_training)
    gathered: list[Any] | None = [records]
    if dist.is_initialized():  # one collective, after every rank's last batch
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(records, gathered, dst=0)
    result: dict[str, Any] = {}
    if not dist.is_initialized() or dist.get_rank() == 0:
        merged = [r for part in gathered or () for r in part]
        images = len(merged)
        detections = sum(len(r["scores"]) for r in merged)
        result = {"images": images, "duplicates": images - len({r["image_id"] for r in merged}),
                  "boxes": sum(len(r["labels"]) for r in merged), "detections": detections,
                  "detections_per_image": detections / max(images, 1)}
        try:
            stats, table = coco_map(merged, len(loader.label_map or {}) + 1)
            result.update(zip(COCO_STATS, stats, strict=True), table=table)
        except ImportError:  # pycocotools missing: the counts only
            pass
    if dist.is_initialized():
        shared = [result]
        dist.broadcast_object_list(shared, src=0)
        result = shared[0]
    return result


def describe(result: dict[str, Any], world: int) -> str:
    """One line: what was evaluated and its box mAP."""
    counts = (f"{result['images']} images over {world} rank{'s' if world > 1 else ''}, {result['boxes']} boxes, "
              f"{result['detections_per_image']:.1f} detections/image")
    if "AP" not in result:
        return f"detections: {counts} (install pycocotools for COCO mAP)"
    note = "; no detection scored above the model's threshold" if result["detections"] == 0 else ""
    return f"bbox AP {result['AP']:.4f}  AP50 {result['AP50']:.4f}  AP75 {result['AP75']:.4f}  ({counts}{note})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser: argparse.ArgumentParser = recipe_args.RecipeParser(description=__doc__)
    parser.add_argument("shards", help="packed COCO validation dataset (directory, index.json or URL)")
    parser.add_argument("--checkpoint", default=None,
                        help="train_detector.py checkpoint to evaluate (default: an untrained model)")
    parser.add_argument("--arch", type=recipe_args.model_name("detection"), default=None,
                        help="torchvision detection model [default: the checkpoint's, else "
                             "fasterrcnn_mobilenet_v3_large_320_fpn]")
    parser.add_argument("--batch-size", type=recipe_args.at_least(1), default=8, help="images per batch per rank")
    parser.add_argument("--min-size", type=recipe_args.at_least(1), default=None,
                        help="shorter side the images are resized to [default: the checkpoint's, else 320]")
    parser.add_argument("--max-size", type=recipe_args.at_least(1), default=None,
                        help="longer side at most, after the resize [default: the checkpoint's, else 640]")
    recipe_args.add_eval_arguments(parser)
    args = parser.parse_args(argv)
    if args.checkpoint and not os.path.exists(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    recipe_args.check_device(args.device, parser)
    recipe_args.writable_folder(parser, "--log-keys", args.log_keys)

    rank, world, device = ddp.setup_distributed(args.device)
    try:
        keys_log = ddp.eval_keys_log(args.log_keys, rank)
        ddp.check_kind([args.shards], "coco", "evaluate_detector.py")
        ckpt = ddp.load_checkpoint(args.checkpoint, device=device, needs=("model", "arch", "num_classes", "label_map"),
                                   written_by="train_detector.py") if args.checkpoint else None
        min_size = args.min_size or (ckpt or {}).get("min_size", 320)  # the sizes the model was trained at
        max_size = args.max_size or (ckpt or {}).get("max_size", 640)
        recipe_args.check_sizes(parser, min_size, max_size, given=bool(args.min_size and args.max_size))
        if ckpt is not None:
            recipe_args.checkpoint_arch(parser, args.arch, args.checkpoint, ckpt["arch"])
        with val_loader(args.shards, batch_size=args.batch_size, min_size=min_size, max_size=max_size,
                        workers=args.workers, device=device, keys=keys_log is not None) as loader:
            arch, num_classes = args.arch or "fasterrcnn_mobilenet_v3_large_320_fpn", len(loader.label_map or {}) + 1
            if ckpt is not None:
                if ckpt["label_map"] != loader.label_map:
                    raise ShardkitError(f"{args.shards}: its categories differ from those {args.checkpoint} was "
                                        "trained on (label maps differ)")
                arch, num_classes = ckpt["arch"], ckpt["num_classes"]
            model = make_model(arch, num_classes, min_size, max_size).to(device)
            if ckpt is not None:
                ddp.load_model_state(model, ckpt, args.checkpoint)
            if device.type == "cuda":
                model = model.to(memory_format=torch.channels_last)
            result = evaluate(model, loader, keys_log=keys_log)
            batches = len(loader)
        if rank == 0:
            if result.get("table"):
                print(result["table"], flush=True)
            print(f"{describe(result, world)}; {batches} batches on rank 0", flush=True)
        return result
    except ShardkitError as err:  # shards that are not this task's, a dataset that is not there, ...
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
