"""``shardkit bench --train MODEL``: the images/s of a training step fed by each loader.

A loader is judged by the step it feeds, not by its own rate: its GPU and host work compete with
the step. For every contender and repetition, on one freshly built loader:

1. *synthetic*: the step runs on one fixed batch already on the device (the loader's own first
   batch, so the step does exactly the work it does when fed), ``warmup`` steps then ``steps``
   timed ones, synchronised at both ends: the rate the GPU could reach. Where batches differ in
   cost (detection: image sizes), it cycles over the loader's first ``fixed_batches`` instead;
2. *fed*: the same step on the loader's batches, epochs chained: ``warmup + steps`` untimed
   steps (the lead-in, below), then ``steps`` timed;
3. *synthetic* again, as in 1.

Every run is a process of its own (:mod:`shardkit.bench.isolate`; ``isolate=False`` keeps them
in this one, for tests): its own compiled step and loader, nothing of another contender alive
beside it, as in a job that trains with one loader. The parent process touches no GPU until the
runs are over. A bench stopped part-way (Ctrl-C, SIGTERM) stops the run in progress and keeps
those it finished: :func:`run_train_bench` raises :class:`~shardkit.bench.finished.Interrupted`
with their report.

``share = fed / synthetic``, the synthetic rate taken over both synthetic runs (images over
seconds), so drift of the machine during a run hits both sides alike. Contenders run in
alternating order (A B, B A, …). ``host_wait`` is the part of the fed run the training loop
spent waiting for the next batch.

*Read-ahead.* A loader keeps making batches while a synthetic run takes none. Each synthetic
run therefore starts after a pause (``settle_s``) in which the loader fills its buffers
(prefetch queues, a feeder's ring) and goes idle, so the step runs beside an idle loader, as
alike for every contender as a pause can make it. The fed run then starts with those buffers
full: batches it did not wait for. Its lead-in uses them up: a loader delivering a share ``s``
of the step's rate drains ``(1 - s)`` of a batch per step, so ``warmup + steps`` untimed steps
leave at most ``H - (1 - s)(warmup + steps)`` of its ``H`` buffered batches to be counted in the
timed steps (with 3 feeders, ``H`` is about 12; 215 lead-in steps drain them at any share up to
94%), and a loader faster than the step keeps its buffers full at both ends of the timed run,
which counts nothing free. The same lead-in for every contender; no guess at when a buffer is
empty (a single long wait for ``next`` can come from the GIL or the allocator with batches
ready).

*Settling.* A ShardLoader with ``feeders="auto"`` times the loop fed by its feeders and fed
from the training process before it keeps one (its trial, 64 to 128 batches). When the lead-in
ends before that, it goes on one step at a time until the loader has settled, so the timed
steps are fed from where it stays.

On CUDA, two figures say where a lost share
goes (``torch.profiler``: the summed durations of the kernels and copies on the device, from
every thread and stream of the process): ``step_gpu_ms``, the GPU time of one step
(against the synthetic wall time per step: a step whose GPU time is well below its wall time
is *host-bound*: its Python and kernel launches set its pace, and a loader costs it mostly
through the host: the GIL, CPU); and ``loader_gpu_ms``, the GPU time of one batch of the
loader running alone (decode, augment and copies). Both are taken after every timed run of the
process, never between them: once ``torch.profiler`` has run in a process, every later kernel
launch in it pays for the profiler's CUDA callbacks (a compiled ResNet-18 step on an H200 ran
11.2–12.3k img/s before a 10-step profile and 9.1–9.5k after it), which would slow the timed
runs after it of a host-bound step and not a script without a profiler. An isolated run takes
them on its own loader after its timed runs; :func:`run_contenders`, whose runs share a process,
on one more loader per contender once every timed run is over.

NVIDIA DALI, when installed, is two more contenders (:mod:`shardkit.bench.dali`): ``dali`` reads
the packed shards with ``fn.readers.webdataset`` (through their ``.dali.idx`` files when present),
``dali_files`` the ImageFolder tree with ``fn.readers.file``; both decode with a random crop on the
GPU (``mixed``), resize, flip and normalise, and deliver what ShardLoader delivers. Their
``threads`` are ``workers``, or each of ``dali_threads`` in turn (one row each: DALI's best
thread count differs by machine and model, and a bench must show the competitor at its best).
DALI shuffles through a buffer, so its epochs are approximate (a sample can slip into the next
one); the step counts batches, not epochs.

The measurement (:func:`measure`, :func:`run_contenders`, :func:`summarise`,
:func:`~shardkit.bench.train_report.train_table`) takes any :class:`Step`, which owns bringing a
loader's batch to the device and copying the fixed one; :mod:`shardkit.bench.train_detection` drives a detector with it.

The step (:class:`~shardkit.bench.train_step.TrainStep`): a torchvision classifier
(``resnet18``/``resnet50``), ``channels_last``, bf16 autocast, SGD with momentum, ``torch.compile``
(unless ``compile=False``). ShardLoader delivers batches
already normalised (bf16, channels_last, on its own stream); the ImageFolder baseline delivers
uint8, which the step normalises on the device, as a careful user of it would; so does the
``shardloader_cpu`` contender, ShardLoader's CPU route (decode and crop in the workers), whose
batches the step copies to the device from pageable memory (ShardLoader pins only on its GPU
route, and refuses ``pin_memory`` beside a GPU; the ImageFolder baseline's are pinned).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from shardkit.bench import baselines, conditions, dali
from shardkit.bench.checks import check_train_shards
from shardkit.bench.finished import FinishedRuns
from shardkit.bench.harness import alternating_order, quiet_worker_count, settled, steady
from shardkit.bench.isolate import in_fresh_process
from shardkit.bench.report import counted, created
from shardkit.bench.step_timing import Step, gpu_times, run_steps
from shardkit.bench.train_report import against_best_dali, format_train_table, say_if_long, summarise, with_feeders
from shardkit.bench.train_step import TrainStep
from shardkit.loader.feed.cuda_sync import sleep_while_waiting
from shardkit.loader.run.forks import freeze_forked_children

__all__ = ["MODELS", "SETTLE_S", "Step", "TrainBenchConfig", "TrainRun", "TrainStep", "format_train_table", "measure",
           "counted", "run_contenders", "run_one", "run_train_bench", "summarise"]

MODELS = ("resnet18", "resnet50")
TRAIN_CONTENDERS = ("imagefolder", "shardloader", "shardloader_inproc", "shardloader_feeders", "shardloader_tc",
                    "shardloader_cpu", "dali", "dali_files")
DALI_CONTENDERS = ("dali", "dali_files")
SETTLE_S = 1.0  # the pause before each synthetic run, in which the loader fills its buffers (see the module doc)


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
    feeders: int | str = "auto"  # the shardloader and shardloader_tc contenders' (ShardLoader's feeders)
    settle_s: float = SETTLE_S  # the pause before each synthetic run (see the module doc)
    dali_threads: tuple[int, ...] = ()  # DALI's num_threads, one row each (empty: workers)
    dali_hw_decoder_load: float | None = None  # share of JPEGs on the hardware decoder (None: DALI's default)
    dali_prefetch: int = 2  # DALI's prefetch_queue_depth
    isolate: bool = True  # each run in a process of its own (see the module doc)
    sleep_waits: bool = False  # each run's CUDA waits sleep instead of spinning (see run_one)

    def validate(self) -> None:
        """Raise ValueError on settings that cannot be measured."""
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if min(self.size, self.batch_size, self.steps, self.repeats) < 1 or min(self.workers, self.warmup,
                                                                                   self.settle_s) < 0:
            raise ValueError("size, batch_size, steps and repeats must be >= 1; workers, warmup and settle_s >= 0")
        unknown = set(self.contenders) - set(TRAIN_CONTENDERS)
        if unknown or not self.contenders:
            raise ValueError(f"contenders must be among {TRAIN_CONTENDERS}, got {self.contenders}")
        if self.feeders != "auto" and (isinstance(self.feeders, bool) or not isinstance(self.feeders, int)
                                       or not 0 <= self.feeders <= self.workers):
            raise ValueError(f"feeders must be 'auto' or an int from 0 to workers ({self.workers}), "
                             f"got {self.feeders!r}")
        if "shardloader_feeders" in self.contenders and self.workers < 1:
            raise ValueError("the shardloader_feeders contender needs workers >= 1 (feeders share them)")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.dali_threads):
            raise ValueError(f"dali_threads must be whole numbers >= 1, got {self.dali_threads}")
        if self.dali_hw_decoder_load is not None and not 0 <= self.dali_hw_decoder_load <= 1:
            raise ValueError(f"dali_hw_decoder_load must be from 0 to 1, got {self.dali_hw_decoder_load}")
        if self.dali_prefetch < 1:
            raise ValueError(f"dali_prefetch must be >= 1, got {self.dali_prefetch}")
        if self.sleep_waits and (not self.isolate or not self.device.startswith("cuda")):
            raise ValueError("sleep_waits needs a cuda device and isolated runs (it is set before a process's CUDA "
                             "context exists)")
        if set(self.contenders) & set(DALI_CONTENDERS) and not dali.dali_available():
            raise ValueError("the dali contenders need NVIDIA DALI (pip install nvidia-dali-cuda130)")


def _forever(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, epoch after epoch (each ``iter()`` is one epoch)."""
    freeze_forked_children()  # a baseline's DataLoader forks its workers in a CUDA process
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader delivered no batch in an epoch")


@dataclass(frozen=True)
class TrainRun:
    """One repetition of one contender: synthetic and fed step rates, where the fed run waited,
    and (on CUDA) the GPU time of one step and of one batch of the loader alone."""

    synthetic_images_per_second: float
    fed_images_per_second: float
    host_wait_fraction: float
    loader_gpu_ms_per_batch: float | None
    step_gpu_ms: float | None = None
    feeders: int | None = None  # the loader's feeder processes, as it ran (ShardLoader.feeders)
    #: feeders="auto": the loop's median ms per batch as its trial timed them, fed by the feeders
    #: ("feeders") and from the training process ("here"); None without a trial
    trial_ms: dict[str, float] | None = None

    @property
    def share(self) -> float:
        return self.fed_images_per_second / self.synthetic_images_per_second


def measure(step: Step, loader: Iterable[Any], *, steps: int, warmup: int, batch_size: int,
            fixed_batches: int = 1, profile_batches: int = 10, settle_s: float = SETTLE_S,
            paced: Callable[..., bool | None] | None = None) -> TrainRun:
    """Synthetic, fed, then synthetic again: the rates of ``step`` with ``loader`` (see the module
    doc); the synthetic runs cycle over the loader's first ``fixed_batches``, through
    ``step.to_device`` and ``step.clone``, each after ``settle_s`` seconds in which the loader
    fills its buffers. On CUDA the step's and the loader's GPU time follow, over
    ``profile_batches`` each, after the timed runs. ``paced(seconds, early=...)``: told how long
    this run takes, first (``early=True``) from the fastest of the first synthetic run's warm-up
    steps after its first (where ``warmup >= 2``; a step on the CPU can take seconds), then, unless
    that returned True (said), the least it takes once that run has timed the step."""
    fed = map(step.to_device, _forever(loader))
    fixed = [step.clone(next(fed)) for _ in range(fixed_batches)]
    steady(loader)  # feeders="auto" starts its feeders behind the first batches: time them in place

    said = False

    def synthetic_seconds(first: bool = False) -> float:
        nonlocal said
        time.sleep(settle_s)
        batches = itertools.cycle(fixed)  # each run takes the same batches in the same order
        if first and paced is not None and warmup >= 2:  # the first warm-up step compiles: not counted,
            run_steps(step, batches, 1)                     # nor the time of a step that compiles again
            each = min(run_steps(step, batches, 1)[0] for _ in range(warmup - 1))
            said = bool(paced(each * (3 * (warmup + steps) + steps), early=True))
        else:
            run_steps(step, batches, warmup)
        return run_steps(step, batches, steps)[0]

    before = synthetic_seconds(first=True)
    if paced is not None and not said:  # two synthetic runs, the lead-in and the fed run, each step at least this long
        paced(before / steps * (3 * (warmup + steps) + steps))
    run_steps(step, fed, warmup + steps)  # the lead-in: uses up what the loader buffered meanwhile
    while not settled(loader):  # feeders="auto" still timing the loop both ways
        run_steps(step, fed, 1)
    seconds, waited = run_steps(step, fed, steps)
    synthetic_rate = 2 * steps * batch_size / (before + synthetic_seconds())
    step_ms, loader_ms = gpu_times(step, fed, fixed[0], warmup, profile_batches, getattr(loader, "feeders", 0))
    trial = getattr(loader, "trial", None)
    trial_ms = {side: pace * 1e3 for side, pace in trial.paces.items()} if trial is not None and trial.paces else None
    return TrainRun(synthetic_rate, steps * batch_size / seconds, waited / seconds, loader_ms, step_ms,
                    getattr(loader, "feeders", None), trial_ms)


def _contenders(cfg: TrainBenchConfig) -> dict[str, tuple[str, Callable[[], Any]]]:
    from shardkit import transforms
    from shardkit.codec.backend import prefer_decoder
    from shardkit.loader import GpuOptions, ShardLoader
    from shardkit.loader.feed.layout import auto_feeders

    out: dict[str, tuple[str, Callable[[], Any]]] = {}
    if "imagefolder" in cfg.contenders:
        out["imagefolder"] = ("torchvision ImageFolder + DataLoader", lambda: baselines.imagefolder_loader(
            cfg.imagefolder, size=cfg.size, train=True, batch_size=cfg.batch_size, workers=cfg.workers,
            device=cfg.device))
    bf16 = transforms.imagenet_train(cfg.size, normalize=True, dtype=torch.bfloat16, channels_last=True)

    def shardloader(gpu: GpuOptions | None, decoder: str | None = None, feeders: int | str = "auto"
                    ) -> Callable[[], Any]:
        def build() -> Any:
            prefer_decoder(decoder)  # the GPU decoder is chosen when the loader is built
            try:
                return ShardLoader(cfg.shards, batch_size=cfg.batch_size, transform=bf16, num_workers=cfg.workers,
                                   device=cfg.device, drop_last=True, gpu=gpu, feeders=feeders)
            finally:
                prefer_decoder(None)
        return build

    if "shardloader" in cfg.contenders:  # labels say the feeders the loaders ran (with_feeders)
        out["shardloader"] = ("shardkit ShardLoader", shardloader(None, feeders=cfg.feeders))
    if "shardloader_inproc" in cfg.contenders:  # the route in the training process (feeders=0)
        out["shardloader_inproc"] = ("shardkit ShardLoader, no feeders", shardloader(None, feeders=0))
    if "shardloader_feeders" in cfg.contenders:  # "auto"'s feeder count on CUDA, kept whatever the loop's pace
        fixed = auto_feeders(cfg.workers)
        out["shardloader_feeders"] = ("shardkit ShardLoader, feeders fixed", shardloader(None, feeders=fixed))
    if "shardloader_tc" in cfg.contenders:  # TorchCodec's batched decode (hardware engines) from 4 threads
        out["shardloader_tc"] = ("shardkit ShardLoader TorchCodec x4", shardloader(GpuOptions(decode_threads=4),
                                                                                   "torchcodec", feeders=cfg.feeders))

    if "shardloader_cpu" in cfg.contenders:  # decoded and cropped on the CPU; the step normalises the uint8 batch
        out["shardloader_cpu"] = ("shardkit ShardLoader, CPU route", lambda: ShardLoader(
            cfg.shards, batch_size=cfg.batch_size, transform=transforms.imagenet_train(cfg.size),
            num_workers=cfg.workers, device="cpu", drop_last=True))

    def dali_loader(reader: str, source: str, threads: int) -> Callable[[], Any]:
        return lambda: dali.DaliTrainLoader(reader, source, size=cfg.size, batch_size=cfg.batch_size,
                                            threads=threads, device=cfg.device, prefetch=cfg.dali_prefetch,
                                            hw_decoder_load=cfg.dali_hw_decoder_load)

    sweep = cfg.dali_threads or (cfg.workers,)
    for name, reader, source, label in (
            ("dali", "webdataset", cfg.shards, "NVIDIA DALI webdataset ({index}), {threads}"),
            ("dali_files", "file", cfg.imagefolder, "NVIDIA DALI readers.file (ImageFolder), {threads}")):
        if name not in cfg.contenders:
            continue
        index = ("its .dali.idx" if dali.has_dali_index(cfg.shards) else ".dali.idx made by the bench"
                 ) if reader == "webdataset" else ""
        for threads in sweep:
            row = name if len(sweep) == 1 else f"{name}@{threads}"
            out[row] = (label.format(index=index, threads=counted(threads, "thread")),
                        dali_loader(reader, source, threads))
    return out


def run_contenders(contenders: Mapping[str, tuple[Step, Callable[[], Any]]], *, steps: int, warmup: int,
                   batch_size: int, repeats: int, fixed_batches: int = 1, settle_s: float = SETTLE_S,
                   after_run: Callable[[str, int, TrainRun], None] | None = None,
                   profile_batches: int = 10) -> dict[str, list[TrainRun]]:
    """:func:`measure` each contender ``repeats`` times in alternating order, each run on a freshly
    built loader (closed after it). ``contenders``: name -> (the step it feeds, its loader's builder);
    the steps may share one model. ``after_run(name, repetition, run)`` follows every run (its GPU
    times not yet known). The GPU times are taken once per contender after every timed run, on
    one more loader each (``profile_batches`` profiled calls; 0: none), and set on all its runs.

    Raises:
        ValueError: a loader that delivers no batch in an epoch.
    """
    runs: dict[str, list[TrainRun]] = {name: [] for name in contenders}
    order = [(rep, name) for rep, names in enumerate(alternating_order(list(contenders), repeats))
             for name in names]
    for i, (rep, name) in enumerate(order):
        step, build = contenders[name]
        with _built(build) as loader:
            run = measure(step, loader, steps=steps, warmup=warmup, batch_size=batch_size,
                          fixed_batches=fixed_batches, settle_s=settle_s, profile_batches=0,
                          paced=functools.partial(say_if_long, len(order)) if i == 0 else None)
            runs[name].append(run)  # kept before the loader closes: a stop while it closes loses no run
            if after_run is not None:
                after_run(name, rep, run)
    if profile_batches:  # every timed run is over: the profiler can no longer slow one
        for name, (step, build) in contenders.items():
            if step.device.type != "cuda":  # GPU times are CUDA's only: no loader built for none
                continue
            with _built(build) as loader:
                fed = map(step.to_device, _forever(loader))
                fixed = step.clone(next(fed))
                step_ms, loader_ms = gpu_times(step, fed, fixed, warmup, profile_batches,
                                               getattr(loader, "feeders", 0))
            runs[name] = [replace(r, step_gpu_ms=step_ms, loader_gpu_ms_per_batch=loader_ms) for r in runs[name]]
    return runs


@contextlib.contextmanager
def _built(build: Callable[[], Any]) -> Iterator[Any]:
    """A loader from ``build``, closed (where it can be) and dropped after the block; torch's
    warning of more workers than cores is not printed while it is built and used."""
    with quiet_worker_count():
        loader = build()
        try:
            yield loader
        finally:
            close = getattr(loader, "close", None)
            if close is not None:
                close()
            del loader


def run_one(cfg: TrainBenchConfig, name: str, classes: int, first: bool = False) -> TrainRun:
    """One run of contender ``name`` (a row of the report) with a step and a loader of its own: what
    each fresh process of an isolated bench does. With ``sleep_waits`` the process's host waits on
    the device (the step's synchronisations, the loaders' CUDA waits: torchvision's nvJPEG call
    waits for its stream) block instead of spinning a core, set before its CUDA context exists
    (:func:`~shardkit.loader.feed.cuda_sync.sleep_while_waiting`, what each feeder does).
    ``first``: the bench's first run, which says how long the bench takes where that is long
    (:func:`say_if_long`)."""
    device = torch.device(cfg.device)
    if cfg.sleep_waits and not sleep_while_waiting(device.index or 0):
        raise RuntimeError("sleep_waits: the CUDA driver refused to make this process's waits block")
    step = TrainStep(cfg.model, classes, device, compile=cfg.compile)
    _label, build = _contenders(cfg)[name]
    with _built(build) as loader:  # its one run is the process's last: the GPU times follow it on its loader
        return measure(step, loader, steps=cfg.steps, warmup=cfg.warmup, batch_size=cfg.batch_size,
                       settle_s=cfg.settle_s,
                       paced=functools.partial(say_if_long, len(cfg.contenders) * cfg.repeats) if first else None)


def run_train_bench(cfg: TrainBenchConfig, *, after_run: Callable[[str, int, TrainRun], None] | None = None
                    ) -> dict[str, Any]:
    """Measure every contender ``repeats`` times (alternating); return the report dict.

    Raises:
        ValueError: invalid settings, or a dataset too small for the steps asked for.
        Interrupted: the bench was stopped part-way (Ctrl-C, SIGTERM); it carries the report of
            the runs it finished (:mod:`shardkit.bench.finished`).
    """
    cfg.validate()
    data = conditions.describe_imagefolder(cfg.imagefolder)
    check_train_shards(cfg.shards, data, cfg.batch_size)
    contenders = _contenders(cfg)
    finished = FinishedRuns(contenders, cfg.repeats, after_run)
    with finished.kept(lambda runs, mark: _report(cfg, data, contenders, runs, mark)):
        if cfg.isolate:
            order = [(rep, name) for rep, names in enumerate(alternating_order(list(contenders), cfg.repeats))
                     for name in names]
            for i, (rep, name) in enumerate(order):  # kept once it answers, before its process has ended
                in_fresh_process(run_one, cfg, name, data["classes"], i == 0, what=f"the run of {name}",
                                 answered=functools.partial(finished.add, name, rep))
            runs = finished.runs
        else:
            step = TrainStep(cfg.model, data["classes"], torch.device(cfg.device), compile=cfg.compile)
            runs = run_contenders({name: (step, build) for name, (_label, build) in contenders.items()},
                                  steps=cfg.steps, warmup=cfg.warmup, batch_size=cfg.batch_size, repeats=cfg.repeats,
                                  settle_s=cfg.settle_s, after_run=finished.add)
    return _report(cfg, data, contenders, runs, None)


def _report(cfg: TrainBenchConfig, data: dict[str, Any], contenders: Mapping[str, tuple[str, Callable[[], Any]]],
            runs: Mapping[str, list[TrainRun]], interrupted: dict[str, Any] | None) -> dict[str, Any]:
    """The report of ``runs``: a row per contender that finished a run; ``interrupted``: the mark
    of a bench stopped part-way (None: it ran to its end)."""
    results = [{"name": name, "label": with_feeders(label, runs[name]), **summarise(runs[name])}
               for name, (label, _build) in contenders.items() if runs.get(name)]
    against_best_dali(results, DALI_CONTENDERS)
    conds = {"machine": conditions.machine(), "versions": conditions.versions(), "gpu": conditions.gpu(cfg.device),
             "data": data}
    return {"schema": "shardkit.bench.train/1", "created": created(), "config": asdict(cfg), "conditions": conds,
            "interrupted": interrupted, "results": results}
