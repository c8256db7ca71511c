"""GPU input pipeline, side by side in one run: ImageFolder+DataLoader, nvJPEG decode alone,
ShardLoader(device="cuda") with nvJPEG (on plain shards, and on shards packed with
``--jpeg-restart``: ``--restart-shards``), the batched kernel alone, and a ResNet-50 training step.

Conditions: one CUDA device, ``--workers`` DataLoader workers, batch ``--batch``, output
RandomResizedCrop(224) + flip uint8 [B,3,224,224] delivered on the GPU (synchronised at the
end of each timed span), warm page cache, local disk. Each rate skips ``--warmup`` batches
(worker start-up, JIT) before timing ``--batches`` batches.

Run (repository root)::

    python -m benchmarks.bench_gpu --root /tmp/inet --shards /tmp/shards --out results.json \\
        --phases imagefolder,nvjpeg,kernel,shardkit,train
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from shardkit import ShardLoader, transforms
from shardkit.bench import baselines
from shardkit.codec.nvjpeg import nvjpeg_friendly
from shardkit.loader import GpuOptions
from shardkit.transforms.gpu import crop_resize_flip_batch, geometry_rows


def _timed(batches: Iterator[Any], warmup: int, n: int) -> tuple[float, int]:
    for _ in range(warmup):
        next(batches)
    torch.cuda.synchronize()
    t0, count = time.perf_counter(), 0
    for _ in range(n):
        x = next(batches)[0]
        count += x.shape[0] if hasattr(x, "shape") else len(x)
    torch.cuda.synchronize()
    return count / (time.perf_counter() - t0), count


def _forever(make: Any) -> Iterator[Any]:
    while True:
        yield from make()


def imagefolder_loader(root: str, workers: int, batch: int) -> Any:
    """The ``shardkit bench`` ImageFolder baseline: RandomResizedCrop(224) + flip, uint8 out,
    shuffled, ``drop_last=True``, persistent workers, pinned memory (batches go to CUDA)."""
    return baselines.imagefolder_loader(root, size=224, train=True, batch_size=batch,
                                        workers=workers, device="cuda")


def imagefolder_cuda(dl: Any) -> Iterator[Any]:
    for x, y in _forever(lambda: iter(dl)):
        yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)


def _jpegs(root: str, limit: int) -> list[torch.Tensor]:
    raw = [p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()][:limit * 2]
    friendly = [b for b in raw if nvjpeg_friendly(b)][:limit]
    return [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in friendly]


def _cut_jpegs(root: str, limit: int, interval: int) -> list[torch.Tensor]:
    """The JPEGs made restart-indexed in memory, then cut to a RandomResizedCrop box each (what
    ShardLoader's workers ship for shards packed with ``--jpeg-restart``)."""
    import random

    from shardkit.codec import jpeg_restart
    from shardkit.codec.decode import peek_size

    t, rng, out = transforms.imagenet_train(224), random.Random(0), []
    for data in _jpegs(root, limit):
        indexed = jpeg_restart.transcode(data.numpy().tobytes(), interval) or data.numpy().tobytes()
        box = t.sample_params(*peek_size(indexed), rng)
        piece = jpeg_restart.cut(indexed, box.top, box.left, box.height, box.width)
        out.append(torch.frombuffer(bytearray(piece.data if piece else indexed), dtype=torch.uint8))
    return out


def nvjpeg_batches(root: str, batch: int, limit: int = 4096,
                   cut_interval: int = 0) -> Iterator[Any]:
    """Batched nvJPEG decode alone, back to back; ``cut_interval``: of crops cut from
    restart-indexed JPEGs with that interval instead of the whole files."""
    from torchvision.io import decode_jpeg

    datas, i = (_cut_jpegs(root, limit, cut_interval) if cut_interval else _jpegs(root, limit)), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while True:
            chunk = datas[i:i + batch] if i + batch <= len(datas) else datas[:batch]
            i = (i + batch) % max(1, len(datas) - batch)
            yield decode_jpeg(chunk, device="cuda"), None


def kernel_rates(root: str, batch: int) -> dict[str, float]:
    """Milliseconds per batch of the Triton kernel and of the eager reference on decoded images."""
    import random

    imgs = next(nvjpeg_batches(root, batch))[0]
    t, rng = transforms.imagenet_train(224), random.Random(0)
    sizes = [(int(im.shape[1]), int(im.shape[2])) for im in imgs]
    geom = geometry_rows(sizes, [t.sample_params(h, w, rng) for h, w in sizes], (224, 224)).cuda()
    flat = torch.cat([im.reshape(-1) for im in imgs])
    offs = torch.tensor([0] + [im.numel() for im in imgs]).cumsum(0)[:-1].cuda()
    out: dict[str, float] = {}
    for name, comp in (("kernel_ms", True), ("eager_ms", False)):
        for _ in range(3):
            crop_resize_flip_batch(flat, offs, geom, (224, 224), compile=comp)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            crop_resize_flip_batch(flat, offs, geom, (224, 224), compile=comp)
        e.record()
        torch.cuda.synchronize()
        out[name] = s.elapsed_time(e) / 20
    return out


def shardkit_loader(shards: str, workers: int, batch: int, compile: bool = True,
                    **kw: Any) -> ShardLoader:
    t = kw.pop("transform", transforms.imagenet_train(224))
    loader = ShardLoader(shards, batch_size=batch, transform=t, device="cuda", num_workers=workers,
                         drop_last=True, gpu=GpuOptions(compile=compile, **kw.pop("gpu", {})), prefetch=4, **kw)
    loader.wait_for_feeders()  # feeders="auto": started now (its trial then runs in the untimed batches)
    return loader


def settled_batches(loader: ShardLoader) -> Iterator[Any]:
    """``loader``'s batches, epoch after epoch, from the first after it has settled (the trial of
    ``feeders="auto"`` done): what is timed is where it stays."""
    batches = _forever(lambda: iter(loader))
    while not loader.settled:
        next(batches)
    return batches


class Trainer:
    """ResNet-50, bf16 autocast, channels_last, ``torch.compile``d; SGD steps on given batches."""

    def __init__(self) -> None:
        import torchvision

        model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.model = torch.compile(model)
        self.mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if x.dtype == torch.uint8:  # the ImageFolder baseline normalises on the GPU, in the step
            x = ((x.float() - self.mean) / self.std).to(torch.bfloat16)
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def synthetic_ms(self, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
        for _ in range(5):  # compile + warm
            self.step(x, y)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(x, y)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    def fed(self, batches: Iterator[Any], steps: int, synthetic_ms: float, loader: Any = None) -> dict[str, float]:
        """The step fed ``batches`` (of ``loader``, whose ``feeders="auto"`` trial then runs in
        the untimed steps, with the step: it times the training loop)."""
        for _ in range(5):
            self.step(*next(batches))
        while loader is not None and not loader.settled:
            self.step(*next(batches))
        torch.cuda.synchronize()
        waited, t0 = 0.0, time.perf_counter()
        for _ in range(steps):
            w0 = time.perf_counter()
            x, y = next(batches)
            waited += time.perf_counter() - w0
            self.step(x, y)
        torch.cuda.synchronize()
        real = (time.perf_counter() - t0) / steps * 1e3
        return {"synthetic_step_ms": synthetic_ms, "fed_step_ms": real,
                "data_wait_fraction": max(0.0, 1 - synthetic_ms / real),
                "host_wait_fraction": waited * 1e3 / (real * steps),
                "images_per_s": x.shape[0] * 1e3 / real}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__)
    ap.add_argument("--root", required=True)
    ap.add_argument("--shards", required=True)
    ap.add_argument("--restart-shards",
                    help="the same images packed with --jpeg-restart (shardkit_restart, train)")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--train-steps", type=int, default=40)
    ap.add_argument("--phases", default="imagefolder,nvjpeg,kernel,shardkit")
    ap.add_argument("--out", default="bench_gpu.json")
    args = ap.parse_args()
    phases, res = args.phases.split(","), {"device": torch.cuda.get_device_name(),
                                           "args": vars(args)}

    def save(key: str, value: Any) -> None:
        res[key] = value
        print(key, json.dumps(value), flush=True)
        Path(args.out).write_text(json.dumps(res, indent=2))

    if "nvjpeg" in phases:
        save("nvjpeg_decode_only_img_s",
             _timed(nvjpeg_batches(args.root, args.batch), 5, args.batches)[0])
    # the ceiling for restart-indexed shards: decode of the crops' pieces
    if "nvjpeg_cut" in phases:
        save("nvjpeg_cut_decode_only_img_s",
             _timed(nvjpeg_batches(args.root, args.batch, cut_interval=1), 5, args.batches)[0])
    if "nvjpeg256" in phases:  # the same images, two batches per call
        save("nvjpeg_decode_only_b256_img_s",
             _timed(nvjpeg_batches(args.root, 2 * args.batch), 5, args.batches // 2)[0])
    if "kernel" in phases:
        save("kernel", kernel_rates(args.root, args.batch))
    if "shardkit" in phases:
        loader = shardkit_loader(args.shards, args.workers, args.batch)
        rate, _ = _timed(settled_batches(loader), args.warmup, args.batches)
        save("shardkit_cuda_img_s", rate)
        save("shardkit_stats", loader.stats.as_dict())
        del loader
    # restart-indexed JPEGs: workers ship only the crop's intervals
    if "shardkit_restart" in phases:
        loader = shardkit_loader(args.restart_shards, args.workers, args.batch)
        rate, _ = _timed(settled_batches(loader), args.warmup, args.batches)
        save("shardkit_restart_cuda_img_s", rate)
        save("shardkit_restart_stats", loader.stats.as_dict())
        del loader
    if "rawfetch" in phases:  # workers + IPC alone: raw batches reaching the main process
        loader = shardkit_loader(args.shards, args.workers, args.batch, feeders=0)  # the workers in this process
        if loader._supply.dataloader is None:
            raise SystemExit("rawfetch needs workers")
        sizes = (([None] * len(b.images),) for b in _forever(lambda: iter(loader._supply.dataloader)))
        rate, _ = _timed(sizes, args.warmup, args.batches)
        save("raw_fetch_img_s", rate)
        del loader
    if "eager" in phases:
        loader = shardkit_loader(args.shards, args.workers, args.batch, compile=False)
        save("shardkit_cuda_eager_img_s",
             _timed(settled_batches(loader), args.warmup, args.batches // 3)[0])
        del loader
    if "imagefolder" in phases:
        dl = imagefolder_loader(args.root, args.workers, args.batch)
        save("imagefolder_img_s",
             _timed(imagefolder_cuda(dl), args.warmup, min(args.batches, 60))[0])
        del dl
    if "train" in phases:
        trainer = Trainer()
        x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (args.batch,), device="cuda")
        synth = trainer.synthetic_ms(x, y, args.train_steps)
        save("train_synthetic_step_ms", synth)
        t = transforms.imagenet_train(224, normalize=True, dtype=torch.bfloat16, channels_last=True)
        loader = shardkit_loader(args.shards, args.workers, args.batch, transform=t)
        save("train_shardkit", trainer.fed(_forever(lambda: iter(loader)), args.train_steps, synth, loader))
        del loader
        if args.restart_shards:
            loader = shardkit_loader(args.restart_shards, args.workers, args.batch, transform=t)
            save("train_shardkit_restart",
                 trainer.fed(_forever(lambda: iter(loader)), args.train_steps, synth, loader))
            del loader
        dl = imagefolder_loader(args.root, args.workers, args.batch)
        save("train_imagefolder", trainer.fed(imagefolder_cuda(dl), args.train_steps, synth))


if __name__ == "__main__":
    main()
