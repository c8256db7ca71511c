"""DALI feeding a compiled training step, written as a DALI user writes it and with no shardkit
code: the yardstick that ``shardkit bench --train``'s DALI rows are checked against.

NVIDIA's ResNet-50 example pipeline (``fn.decoders.image_random_crop`` on ``mixed``, ``fn.resize``,
``fn.crop_mirror_normalize`` to float16 NHWC, a random flip), ``DALIGenericIterator``, and a
torchvision classifier in ``channels_last``, bf16 autocast, fused SGD with momentum, forward and loss
``torch.compile``d as one function (``shardkit bench --train``'s step, written out).
It times ``--steps`` fed steps after ``--warmup`` ones, then as many steps on one batch already on
the device (the synthetic rate), and prints one JSON line.

    python -m benchmarks.dali_standalone --reader file --source /data/inet --threads 12 --model resnet18 --size 176
    python -m benchmarks.dali_standalone --reader webdataset --source /data/shards --threads 12
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from typing import Any

import torch
import torchvision


def pipeline(reader: str, source: str, size: int, batch_size: int, threads: int, hw_load: float | None) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0, seed=0)
    def train() -> Any:
        if reader == "file":
            jpegs, labels = fn.readers.file(file_root=source, random_shuffle=True, name="reader")
        else:
            tars = sorted(glob.glob(os.path.join(source, "*.tar")))
            jpegs, labels = fn.readers.webdataset(paths=tars, index_paths=[t[:-4] + ".dali.idx" for t in tars],
                                                  ext=["jpg", "cls"], random_shuffle=True, name="reader")
            labels = fn.pad(labels, fill_value=0)
        extra = {} if hw_load is None else {"hw_decoder_load": hw_load}
        images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                               device_memory_padding=211025920, host_memory_padding=140544512,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10, **extra)
        images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_TRIANGULAR)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="HWC",
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                          std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    pipe = train()
    pipe.build()
    return pipe


def labels_of(raw: torch.Tensor) -> torch.Tensor:
    """File reader: int32 ``[B, 1]``; webdataset reader: ASCII digits padded with zeros."""
    if raw.dtype != torch.uint8:
        return raw.reshape(-1).long()
    digits = raw.long() - ord("0")
    value = torch.zeros(raw.shape[0], dtype=torch.long, device=raw.device)
    for column in range(raw.shape[1]):
        ok = (digits[:, column] >= 0) & (digits[:, column] <= 9)
        value = torch.where(ok, value * 10 + digits[:, column], value)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reader", choices=["file", "webdataset"], default="file")
    parser.add_argument("--source", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=176)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=12)
    parser.add_argument("--hw-load", type=float, default=None)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()

    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    device = torch.device("cuda")
    net = getattr(torchvision.models, args.model)(num_classes=args.classes)
    net = net.to(device, memory_format=torch.channels_last)
    # the step of shardkit.bench.train_step.TrainStep, written out: forward and loss compiled as
    # one function, SGD with momentum fused into one kernel for all parameters
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, fused=True)

    @torch.compile
    def loss_of(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", torch.bfloat16):
            return torch.nn.functional.cross_entropy(net(images), labels)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        loss_of(images, labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    pipe = pipeline(args.reader, args.source, args.size, args.batch_size, args.threads, args.hw_load)
    batches = DALIGenericIterator(pipe, ["images", "labels"], reader_name="reader",
                                  last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def fed() -> Any:
        while True:
            for out in batches:
                images = out[0]["images"].permute(0, 3, 1, 2).to(torch.bfloat16)
                yield images, labels_of(out[0]["labels"]).to(device).remainder(args.classes)

    feed = fed()
    for _ in range(args.warmup):
        step(*next(feed))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(*next(feed))
    torch.cuda.synchronize()
    fed_rate = args.steps * args.batch_size / (time.perf_counter() - t0)

    images, labels = (t.clone() for t in next(feed))
    for _ in range(args.warmup):
        step(images, labels)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(images, labels)
    torch.cuda.synchronize()
    synthetic = args.steps * args.batch_size / (time.perf_counter() - t0)
    print(json.dumps({"reader": args.reader, "threads": args.threads, "model": args.model, "size": args.size,
                      "batch_size": args.batch_size, "fed_images_per_second": round(fed_rate),
                      "synthetic_images_per_second": round(synthetic), "share": round(fed_rate / synthetic, 3)}))


if __name__ == "__main__":
    main()
