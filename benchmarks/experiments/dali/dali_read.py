"""NVIDIA DALI reads a packed shardkit dataset through its ``.dali.idx`` files: every sample, right.

1. *Check*: one epoch of ``fn.readers.webdataset(paths=shards, index_paths=<shard>.dali.idx,
   ext=[images, "cls", "json"])``, in order, every image decoded (``fn.decoders.image``,
   ``device="mixed"`` on CUDA: nvJPEG and the hardware JPEG engines; ``"cpu"`` otherwise). It
   must yield exactly the dataset's samples: the count ``index.json`` gives, each key once, the
   label histogram of the shards' ``cls`` members, each ``cls`` equal to its ``json`` label, and
   each decoded image the height and width its ``json`` records (EXIF orientation not applied,
   as shardkit stores it).
2. *Rate* (``--batches N``): the training pipeline of ``shardkit bench --train``'s DALI rows
   alone (:class:`shardkit.bench.dali.DaliTrainLoader`: random-crop decode, resize, flip,
   normalise to bf16), images/s over N batches after 10 untimed ones, synchronised at both
   ends; with ``--imagefolder`` also DALI's file reader on the source tree.

Exits 1 if the check fails. Run from the repository root::

    python -m benchmarks.experiments.dali.dali_read /tmp/shards --device cuda --threads 8 --batches 300 \\
        --imagefolder /tmp/inet --out dali_read.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardkit.bench.baselines import IMAGE_KEYS
from shardkit.bench.dali import DaliTrainLoader
from shardkit.format.dali_index import dali_index_name
from shardkit.format.tarread import iter_members, sample_key
from shardkit.index import read_manifest
from shardkit.storage import Store


def expected_labels(shards: str, names: list[str]) -> collections.Counter[int]:
    """Histogram of the ``cls`` members of the shards, read straight from the tars."""
    counts: collections.Counter[int] = collections.Counter()
    for name in names:
        with open(os.path.join(shards, name), "rb") as f:
            for member, data in iter_members(f, where=name):
                if sample_key(member, where=name)[1] == "cls":
                    counts[int(data)] += 1
    return counts


def check(shards: str, device: str, threads: int, batch: int) -> dict[str, Any]:
    """One in-order epoch through DALI with our index files; what it saw against the dataset."""
    from nvidia.dali import fn, pipeline_def, types

    manifest = read_manifest(Store(shards))
    names = [s.url for s in manifest.shards]
    tars = [os.path.join(shards, n) for n in names]
    indexes = [os.path.join(shards, dali_index_name(n)) for n in names]
    missing = [p for p in indexes if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"{len(missing)} shards lack a DALI index (first: {missing[0]}): "
                         "shardkit index DIR --dali-index writes them")
    gpu = device == "cuda"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, seed=0)
    def pipe() -> Any:
        images, labels, meta = fn.readers.webdataset(paths=tars, index_paths=indexes,
                                                     ext=[IMAGE_KEYS, "cls", "json"],
                                                     missing_component_behavior="error", name="reader")
        decoded = fn.decoders.image(images, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                    adjust_orientation=False)
        return decoded.shape(), labels, meta

    p = pipe()
    t0 = time.perf_counter()
    p.build()
    size = p.epoch_size("reader")
    built = time.perf_counter() - t0
    seen: list[tuple[str, int]] = []
    bad_shape, bad_label = [], []
    t0 = time.perf_counter()
    while len(seen) < size:
        shapes, labels, metas = p.run()
        for i in range(len(shapes)):
            if len(seen) == size:  # the last batch runs into the next epoch
                break
            record = json.loads(bytes(np.array(metas.at(i))))
            label = int(bytes(np.array(labels.at(i))))
            h, w, c = (int(x) for x in np.array(shapes.at(i)))
            key = record.get("source", str(len(seen)))
            seen.append((key, label))
            if (h, w, c) != (record["height"], record["width"], 3):
                bad_shape.append((key, (h, w, c), (record["height"], record["width"])))
            if record.get("label", label) != label:
                bad_label.append((key, label, record["label"]))
    seconds = time.perf_counter() - t0
    got = collections.Counter(label for _, label in seen)
    want = expected_labels(shards, names)
    keys = collections.Counter(key for key, _ in seen)
    result = {"samples_index_json": manifest.num_samples, "dali_epoch_size": size, "samples_read": len(seen),
              "distinct_keys": len(keys), "labels_match_cls_members": got == want,
              "labels_histogram": dict(sorted(got.items())), "wrong_shapes": bad_shape[:10],
              "n_wrong_shapes": len(bad_shape), "cls_differs_from_json": bad_label[:10],
              "build_seconds": round(built, 3), "decode_images_per_second": round(len(seen) / seconds, 1)}
    result["ok"] = (size == len(seen) == manifest.num_samples == len(keys) and got == want and not bad_shape
                    and not bad_label)
    return result


def rate(reader: str, source: str, device: str, threads: int, batch: int, size: int, batches: int) -> float:
    """images/s of the bench's DALI training pipeline alone."""
    loader = DaliTrainLoader(reader, source, size=size, batch_size=batch, threads=threads, device=device)

    def forever() -> Any:
        while True:
            yield from loader

    it = forever()
    for _ in range(10):
        next(it)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        images, _labels = next(it)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    loader.close()
    return batches * batch / seconds


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.experiments.dali.dali_read",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shards", help="a packed dataset (local directory) with .dali.idx files")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=176, help="rate: output side")
    ap.add_argument("--batches", type=int, default=0, help="rate: timed batches (0: no rate)")
    ap.add_argument("--imagefolder", default=None, help="rate: also DALI's file reader on this tree")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import nvidia.dali

    report: dict[str, Any] = {"dali": nvidia.dali.__version__, "torch": torch.__version__, "device": args.device,
                              "threads": args.threads, "batch": args.batch}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    report["check"] = check(args.shards, args.device, args.threads, args.batch)
    print(json.dumps(report["check"], indent=1))
    if args.batches:
        report["rate"] = {"size": args.size, "batches": args.batches}
        report["rate"]["webdataset_images_per_second"] = round(
            rate("webdataset", args.shards, args.device, args.threads, args.batch, args.size, args.batches), 1)
        if args.imagefolder:
            report["rate"]["file_images_per_second"] = round(
                rate("file", args.imagefolder, args.device, args.threads, args.batch, args.size, args.batches), 1)
        print(json.dumps(report["rate"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("DALI CHECK", "OK" if report["check"]["ok"] else "FAILED")
    sys.exit(0 if report["check"]["ok"] else 1)


if __name__ == "__main__":
    main()
