"""``shardkit bench --train MODEL``: the images/s of a training step fed by each loader.

A loader is judged by the step it feeds, not by its own rate: its GPU and host work compete with
the step. For every contender and repetition, on one freshly built loader:

1. *synthetic*: the step runs on one fixed batch already on the device (the loader's own first
   batch, so the step does exactly the work it does when fed), ``warmup`` steps then ``steps``
   timed ones, synchronised at both ends: the rate the GPU could reach;
2. *fed*: the same step on the loader's batches, epochs chained, ``warmup`` then ``steps`` timed.

``share = fed / synthetic``, measured right after each other so drift of the machine hits both.
Contenders run in alternating order (A B, B A, …). ``host_wait`` is the part of the fed run the
training loop spent waiting for the next batch; ``loader_gpu_ms`` (ShardLoader's GPU route)
the time its augment kernels took (CUDA events) plus the host wall time of its synchronous
nvJPEG calls, per batch: an upper bound of its GPU cost, since both stretch while the step's
kernels hold the GPU (the share is the figure that counts).

NVIDIA DALI, when installed, is two more contenders (:mod:`shardkit.bench.dali`): ``dali`` reads
the packed shards with ``fn.readers.webdataset`` (through their ``.dali.idx`` files when present),
``dali_files`` the ImageFolder tree with ``fn.readers.file``; both decode with a random crop on the
GPU (``mixed``), resize, flip and normalise, and deliver what ShardLoader delivers. Their
``threads`` are ``workers``. DALI shuffles through a buffer, so its epochs are approximate
(a sample can slip into the next one); the step counts batches, not epochs.

The step: a torchvision classifier (``resnet18``/``resnet50``), ``channels_last``, bf16 autocast,
SGD with momentum, ``torch.compile`` (unless ``compile=False``). ShardLoader delivers batches
already normalised (bf16, channels_last, on its own stream); the ImageFolder baseline delivers
uint8, which the step normalises on the device, as a careful user of it would.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from shardkit.bench import baselines, conditions, dali
from shardkit.bench.harness import alternating_order
from shardkit.bench.report import spread

__all__ = ["MODELS", "TrainBenchConfig", "TrainStep", "format_train_table", "run_train_bench"]

MODELS = ("resnet18", "resnet50")
TRAIN_CONTENDERS = ("imagefolder", "shardloader", "shardloader_tc", "dali", "dali_files")
DALI_CONTENDERS = ("dali", "dali_files")


@dataclass(frozen=True)
class TrainBenchConfig:
    """What to feed and how long. ``steps``/``warmup``: timed and untimed steps per run (synthetic
    and fed alike); ``repeats``: runs per contender, alternating; ``compile``: ``torch.compile``
    the model (False: eager, e.g. on the CPU in tests)."""

    imagefolder: str
    shards: str
    model: str = "resnet50"
    size: int = 224
    batch_size: int = 128
    workers: int = 8
    steps: int = 100
    warmup: int = 10
    repeats: int = 3
    device: str = "cuda"
    compile: bool = True
    contenders: tuple[str, ...] = ("imagefolder", "shardloader")

    def validate(self) -> None:
        """Raise ValueError on settings that cannot be measured."""
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if min(self.size, self.batch_size, self.steps, self.repeats) < 1 or self.workers < 0 or self.warmup < 0:
            raise ValueError("size, batch_size, steps and repeats must be >= 1; workers and warmup >= 0")
        unknown = set(self.contenders) - set(TRAIN_CONTENDERS)
        if unknown or not self.contenders:
            raise ValueError(f"contenders must be among {TRAIN_CONTENDERS}, got {self.contenders}")
        if set(self.contenders) & set(DALI_CONTENDERS) and not dali.dali_available():
            raise ValueError("the dali contenders need NVIDIA DALI (pip install nvidia-dali-cuda130)")


class TrainStep:
    """One SGD step of a torchvision classifier in bf16 autocast, ``channels_last``.

    uint8 batches are normalised (ImageNet mean/std) inside the step; float batches are taken
    as they come (already normalised by the loader). On the CPU (tests) the step runs in float32:
    bf16 convolutions there are emulated and slow.
    """

    def __init__(self, model: str, num_classes: int, device: torch.device, *, compile: bool = True) -> None:
        import torchvision

        net = getattr(torchvision.models, model)(num_classes=num_classes)
        net = net.to(device, memory_format=torch.channels_last)
        self.device = device
        self.opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        self.net: Callable[[torch.Tensor], torch.Tensor] = torch.compile(net) if compile else net
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.dtype == torch.uint8:
            images = ((images.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        elif self.device.type != "cuda":
            images = images.float()
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(self.net(images), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _forever(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, epoch after epoch (each ``iter()`` is one epoch)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader delivered no batch in an epoch")


def _on_device(batches: Iterator[Any], device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for images, labels, *_ in batches:
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


@dataclass(frozen=True)
class TrainRun:
    """One repetition of one contender: synthetic and fed step rates, and where the fed run waited."""

    synthetic_images_per_second: float
    fed_images_per_second: float
    host_wait_fraction: float
    loader_gpu_ms_per_batch: float | None

    @property
    def share(self) -> float:
        return self.fed_images_per_second / self.synthetic_images_per_second


def _steps(step: TrainStep, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], n: int) -> tuple[float, float]:
    """Run ``n`` steps on ``batches``; wall seconds (synchronised) and seconds spent in ``next``."""
    step.sync()
    waited, t0 = 0.0, time.perf_counter()
    for _ in range(n):
        w0 = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - w0
        step(images, labels)
    step.sync()
    return time.perf_counter() - t0, waited


def measure(step: TrainStep, loader: Iterable[Any], *, steps: int, warmup: int, batch_size: int,
            stats: Callable[[], dict[str, float] | None] | None = None) -> TrainRun:
    """Synthetic then fed rate of ``step`` with ``loader`` (see the module doc)."""
    fed = _on_device(_forever(loader), step.device)
    images, labels = next(fed)
    fixed = (images.clone(), labels.clone())

    def same() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield fixed

    synthetic = same()
    _steps(step, synthetic, warmup)
    seconds, _ = _steps(step, synthetic, steps)
    synthetic_rate = steps * batch_size / seconds
    _steps(step, fed, warmup)
    before = stats() if stats is not None else None
    seconds, waited = _steps(step, fed, steps)
    after = stats() if stats is not None else None
    gpu_ms = None
    if before is not None and after is not None and after.get("gpu_images", 0) > before.get("gpu_images", 0):
        busy = sum(after[k] - before[k] for k in ("gpu_augment_s", "gpu_decode_s"))
        gpu_ms = busy / max(after["batches"] - before["batches"], 1) * 1e3
    return TrainRun(synthetic_rate, steps * batch_size / seconds, waited / seconds, gpu_ms)


def _contenders(cfg: TrainBenchConfig) -> dict[str, tuple[str, Callable[[], Any]]]:
    from shardkit import transforms
    from shardkit.codec.backend import prefer_decoder
    from shardkit.loader import GpuOptions, ShardLoader

    out: dict[str, tuple[str, Callable[[], Any]]] = {}
    if "imagefolder" in cfg.contenders:
        out["imagefolder"] = ("torchvision ImageFolder + DataLoader", lambda: baselines.imagefolder_loader(
            cfg.imagefolder, size=cfg.size, train=True, batch_size=cfg.batch_size, workers=cfg.workers,
            device=cfg.device))
    bf16 = transforms.imagenet_train(cfg.size, normalize=True, dtype=torch.bfloat16, channels_last=True)

    def shardloader(gpu: GpuOptions | None, decoder: str | None = None) -> Callable[[], Any]:
        def build() -> Any:
            prefer_decoder(decoder)  # the GPU decoder is chosen when the loader is built
            try:
                return ShardLoader(cfg.shards, batch_size=cfg.batch_size, transform=bf16, num_workers=cfg.workers,
                                   device=cfg.device, drop_last=True, gpu=gpu)
            finally:
                prefer_decoder(None)
        return build

    if "shardloader" in cfg.contenders:
        out["shardloader"] = ("shardkit ShardLoader", shardloader(None))
    if "shardloader_tc" in cfg.contenders:  # TorchCodec's batched decode (hardware engines) from 4 threads
        out["shardloader_tc"] = ("shardkit ShardLoader TorchCodec x4", shardloader(GpuOptions(decode_threads=4),
                                                                                   "torchcodec"))

    def dali_loader(reader: str, source: str) -> Callable[[], Any]:
        return lambda: dali.DaliTrainLoader(reader, source, size=cfg.size, batch_size=cfg.batch_size,
                                            threads=cfg.workers, device=cfg.device)

    if "dali" in cfg.contenders:
        index = "with .dali.idx" if dali.has_dali_index(cfg.shards) else "no .dali.idx"
        out["dali"] = (f"NVIDIA DALI webdataset ({index})", dali_loader("webdataset", cfg.shards))
    if "dali_files" in cfg.contenders:
        out["dali_files"] = ("NVIDIA DALI readers.file (ImageFolder)", dali_loader("file", cfg.imagefolder))
    return out


def run_train_bench(cfg: TrainBenchConfig, *, after_run: Callable[[str, int, TrainRun], None] | None = None
                    ) -> dict[str, Any]:
    """Measure every contender ``repeats`` times (alternating); return the report dict.

    Raises:
        ValueError: invalid settings, or a dataset too small for the steps asked for.
    """
    cfg.validate()
    device = torch.device(cfg.device)
    data = conditions.describe_imagefolder(cfg.imagefolder)
    step = TrainStep(cfg.model, data["classes"], device, compile=cfg.compile)
    contenders = _contenders(cfg)
    runs: dict[str, list[TrainRun]] = {name: [] for name in contenders}
    order = [(rep, name) for rep, names in enumerate(alternating_order(list(contenders), cfg.repeats))
             for name in names]
    for rep, name in order:
        loader = contenders[name][1]()
        try:
            stats = getattr(loader, "stats", None)
            read: Callable[[], dict[str, float] | None] | None = stats.as_dict if stats is not None else None
            run = measure(step, loader, steps=cfg.steps, warmup=cfg.warmup, batch_size=cfg.batch_size, stats=read)
        finally:
            close = getattr(loader, "close", None)
            if close is not None:
                close()
            del loader
        runs[name].append(run)
        if after_run is not None:
            after_run(name, rep, run)
    results = []
    for name, (label, _build) in contenders.items():
        rs = runs[name]
        gpu = [r.loader_gpu_ms_per_batch for r in rs if r.loader_gpu_ms_per_batch is not None]
        results.append({
            "name": name, "label": label,
            "synthetic_images_per_second": spread([r.synthetic_images_per_second for r in rs]),
            "fed_images_per_second": spread([r.fed_images_per_second for r in rs]),
            "share": spread([r.share for r in rs]),
            "host_wait_fraction": spread([r.host_wait_fraction for r in rs]),
            "loader_gpu_ms_per_batch": statistics.median(gpu) if gpu else None,
            "runs": [asdict(r) for r in rs],
        })
    conds = {"machine": conditions.machine(), "versions": conditions.versions(), "gpu": conditions.gpu(cfg.device),
             "data": data}
    return {"schema": "shardkit.bench.train/1", "config": asdict(cfg), "conditions": conds, "results": results}


def format_train_table(report: dict[str, Any]) -> str:
    """The report as a text table: median (min–max) of each figure over the repetitions."""
    cfg = report["config"]

    def cell(s: dict[str, Any], fmt: str) -> str:
        return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}–{format(s['max'], fmt)})"

    lines = [f"training step: {cfg['model']} @{cfg['size']} px, batch {cfg['batch_size']}, bf16 autocast, "
             f"channels_last, {'torch.compile' if cfg['compile'] else 'eager'}, {cfg['workers']} workers, "
             f"{cfg['steps']} timed steps x {cfg['repeats']} runs on {cfg['device']}",
             f"{'pipeline':<40} {'fed img/s':>22} {'synthetic img/s':>22} {'share':>20} {'host wait':>10} "
             f"{'loader GPU ms/batch':>19}"]
    for r in report["results"]:
        gpu = r["loader_gpu_ms_per_batch"]
        lines.append(f"{r['label']:<40} {cell(r['fed_images_per_second'], ',.0f'):>22} "
                     f"{cell(r['synthetic_images_per_second'], ',.0f'):>22} {cell(r['share'], '.0%'):>20} "
                     f"{r['host_wait_fraction']['median']:>10.1%} {'—' if gpu is None else f'{gpu:.1f}':>19}")
    return "\n".join(lines)
