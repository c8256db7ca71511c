"""Where a COCO route's worker time goes: CPU ms per image of each step, one process, no workers.

Steps of the CPU route's worker step at ``detection_train(MIN, MAX)``, timed one by one with the
process's CPU clock (robust to other load on the machine): read, decode, target, tv_tensors
wrapping, the IoU crop's parameter sampling (``--iou torchvision``: v2's ``RandomIoUCrop``;
``shardkit``: ``IoUCrop``, the same draws), the crop, the resize, the flip, sanitizing; then the
whole worker step of each route as the loader runs it (``DetectionBatchBuilder`` and, for the
GPU route, ``RawDetectionBuilder``, which decodes nothing: it draws the geometry and ships bytes).

Usage (from the repository root)::

    python -m sample_data.coco_like /tmp/coco --images 1000
    shardkit pack /tmp/coco/images --annotations /tmp/coco/instances.json /tmp/coco-shards
    python -m benchmarks.experiments.coco_route.profile_coco_route /tmp/coco-shards --images 300
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from shardkit import ShardLoader, transforms
from shardkit.codec.decode import decode_rgb
from shardkit.loader.routes.coco.target import coco_target
from shardkit.loader.routes.coco.worker import DetectionBatchBuilder
from shardkit.loader.routes.coco_gpu.worker import RawDetectionBuilder
from shardkit.transforms.detection import PER_BOX
from shardkit.transforms.iou_crop import IoUCrop


def per_box(inputs: Any) -> tuple[torch.Tensor, ...]:
    """``SanitizeBoundingBoxes``' labels_getter as ``detection_train`` sets it: every per-box tensor."""
    target = inputs[1] if isinstance(inputs, tuple) else inputs
    return tuple(target[k] for k in PER_BOX if isinstance(target.get(k), torch.Tensor))


def steps(loader: ShardLoader, items: list[tuple[int, int]], args: argparse.Namespace) -> dict[str, float]:
    """CPU seconds per step over ``items``, the steps of ``detection_train`` run one by one."""
    iou = IoUCrop() if args.iou == "shardkit" else v2.RandomIoUCrop()
    rss = v2.RandomShortestSize(args.min_size, max_size=args.max_size)
    flip, sanitize = v2.RandomHorizontalFlip(), v2.SanitizeBoundingBoxes(labels_getter=per_box)
    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    clock = time.process_time
    for k, (shard, index) in enumerate(items):
        t = clock()
        _, fields = loader.reader.read(shard, index)
        spent["read"] += clock() - t
        t = clock()
        image = decode_rgb(next(v for e, v in fields.items() if e != "json"))
        spent["decode"] += clock() - t
        t = clock()
        target = coco_target(fields["json"], image.shape[-2], image.shape[-1])
        spent["target"] += clock() - t
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(k)
            t = clock()
            boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=image.shape[-2:])
            sample = {"image": tv_tensors.Image(image), "boxes": boxes, "labels": target["labels"],
                      "area": target["area"], "iscrowd": target["iscrowd"]}
            spent["wrap"] += clock() - t
            t = clock()
            state = torch.get_rng_state()
            (getattr(iou, "make_params", None) or iou._get_params)([sample["image"], boxes])
            torch.set_rng_state(state)  # the crop below draws the same parameters again
            spent["iou crop parameters"] += clock() - t
            t0 = clock()
            sample = iou(sample)
            spent["iou crop (parameters again + crop)"] += clock() - t0
            for name, op in (("resize", rss), ("flip", flip), ("sanitize", sanitize)):
                t = clock()
                sample = op(sample)
                spent[name] += clock() - t
    return dict(spent)


def worker_step(builder: DetectionBatchBuilder | RawDetectionBuilder, items: list[tuple[int, int]]) -> float:
    """CPU seconds of ``builder.build`` over ``items`` in batches of 4."""
    t = time.process_time()
    for k in range(0, len(items), 4):
        chunk = items[k:k + 4]
        builder.build([s for s, _ in chunk], [i for _, i in chunk], [k + j for j in range(len(chunk))])
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.experiments.coco_route.profile_coco_route",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("shards", help="a packed COCO dataset")
    ap.add_argument("--images", type=int, default=300, help="samples to time")
    ap.add_argument("--min-size", type=int, default=800)
    ap.add_argument("--max-size", type=int, default=1333)
    ap.add_argument("--iou", choices=["shardkit", "torchvision"], default="shardkit",
                    help="the IoU crop sampler timed in the per-step part")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as in a loader worker
    loader = ShardLoader(args.shards, batch_size=4, seed=0)
    items = [(s, i) for s, sh in enumerate(loader.manifest.shards) for i in range(sh.num_samples)][:args.images]
    n = len(items)
    spent = steps(loader, items, args)
    print(f"{n} images, detection_train({args.min_size}, {args.max_size}), CPU ms per image:")
    for name, seconds in spent.items():
        print(f"  {name:38s} {1e3 * seconds / n:6.2f}")
    print(f"  {'sum (without the parameters alone)':38s} "
          f"{1e3 * sum(v for k, v in spent.items() if k != 'iou crop parameters') / n:6.2f}")
    t = transforms.detection_train(args.min_size, args.max_size)
    cpu = worker_step(DetectionBatchBuilder(loader.reader, t), items)
    gpu = worker_step(RawDetectionBuilder(loader.reader, t), items)
    print(f"worker step, CPU route: {1e3 * cpu / n:.2f} ms per image; GPU route: {1e3 * gpu / n:.2f}")


if __name__ == "__main__":
    main()
