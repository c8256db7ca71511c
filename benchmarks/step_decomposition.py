"""Where a fed training step loses its share: the step alone, then the step beside one piece of a
loader's work at a time, then fed by the loaders themselves.

``shardkit bench --train`` says how much of the step's rate a loader keeps (its *share*); this says
which part of the loader's work takes the rest. On one CUDA device, a ``TrainStep`` (the bench's
step) runs ``--steps`` timed steps after ``--warmup`` untimed ones on pre-decoded batches already
on the device, beside one *term* at a time:

``alone``
    nothing else (the synthetic rate: every ratio is against this, measured in the same round);
``h2d@thread``, ``h2d@process``
    a copy of one pinned uint8 ``[B, 3, size, size]`` batch to the device per step, on a stream of
    its own, from a thread of this process or from another process (its own CUDA context: kernels
    of two processes do not run at the same time on one GPU, they take turns);
``decode@thread``, ``decode@process``
    torchvision's batched nvJPEG decode (``decode_jpeg(list, device="cuda")``) of ``B`` of the
    tree's JPEGs per step, the route's decoder;
``resize@thread``, ``resize@process``
    the route's crop-resize-flip kernel and normalisation to bf16 ``channels_last`` on one decoded
    batch per step;
``route@thread``, ``route@process``
    both: the GPU work of one batch of ShardLoader's GPU route, with none of its host machinery
    (reading, workers, hand-off); its feeders run it from other processes;
``gil``
    one Python thread of this process spinning (host work that holds the GIL, as a loader's
    Python code in the training process does);
``cpu``
    ``--workers`` processes spinning on the host's cores (a loader's workers at full load);
``shardloader_beside``
    ShardLoader (GPU route, feeders ``auto``) iterated by a thread of this process, its batches
    dropped: all of its work and hand-off, but not feeding the step;
``shardloader``, ``dali``, ``dali_files``
    the step *fed* by ShardLoader or by DALI (``readers.webdataset`` on the shards, ``readers.file``
    on the tree, ``--dali-threads``), as ``shardkit bench --train`` feeds it, after a lead-in of
    ``warmup + steps`` steps;
``dali_decode@thread``, ``dali_pipeline@thread``
    DALI beside the step, not feeding it: a pipeline of its webdataset reader and its mixed
    (nvJPEG + hardware) ``image_random_crop`` decoder alone, or its whole training pipeline.

A paced term does one unit of work per step (a semaphore released by the step loop) and waits for
its stream, as a loader that keeps up with the step; ``kept`` says how many units it finished per
timed step (under 1: it could not keep up). Terms run in alternating order over ``--rounds``
rounds, all side threads and processes started before the first round and idle between terms.

``--variants`` then times the synthetic rate of step variants on the same batches, alternating:
``previous`` (the bench's step before this benchmark: compiled model, eager loss, foreach SGD),
``default`` (the bench's step: forward and loss compiled as one function, fused SGD) and
``reduce-overhead`` (the same under ``torch.compile(mode="reduce-overhead")``: CUDA graphs), each
with its GPU time per step (``torch.profiler``, after every timed run: a profiler session slows
every kernel launch of the process after it) and the host time to issue one step.

    python -m benchmarks.step_decomposition /tmp/inet /tmp/shards --model resnet18 --size 176 \\
        --workers 16 --steps 150 --rounds 2 --out decomposition.json
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.decomposition_work import Side, build_loader, device_batches, forever

FED = ("shardloader", "dali", "dali_files")
DEFAULT_TERMS = ("alone", "h2d@thread", "h2d@process", "decode@thread", "decode@process", "resize@thread",
                 "resize@process", "route@thread", "route@process", "gil", "cpu", "shardloader_beside",
                 "shardloader", "dali_decode@thread", "dali_pipeline@thread", "dali", "dali_files")


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- steps


class PreviousStep:
    """The bench's step before this benchmark: compiled model, loss outside it, foreach SGD."""

    def __init__(self, model: str, classes: int, device: torch.device) -> None:
        import torchvision

        net = getattr(torchvision.models, model)(num_classes=classes).to(device, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        self.net = torch.compile(net)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast("cuda", torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.net(images), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def timed(step: Callable[..., None], batches: Iterator[tuple[Any, Any]], n: int,
          tick: Callable[[], None] | None = None) -> tuple[float, float]:
    """Wall seconds of ``n`` steps (synchronised at both ends) and the mean host seconds per call."""
    torch.cuda.synchronize()
    issue, t0 = 0.0, time.perf_counter()
    for _ in range(n):
        images, labels = next(batches)
        if tick is not None:
            tick()
        c0 = time.perf_counter()
        step(images, labels)
        issue += time.perf_counter() - c0
    torch.cuda.synchronize()
    return time.perf_counter() - t0, issue / n


def cycle(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from batches


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    med = statistics.median(values)
    return fmt.format(med) if len(values) == 1 else f"{fmt.format(med)} ({fmt.format(min(values))}–" \
                                                     f"{fmt.format(max(values))})"


def variants(args: argparse.Namespace, batches: list[tuple[torch.Tensor, torch.Tensor]], classes: int
             ) -> dict[str, Any]:
    from shardkit.bench.step_timing import device_ms
    from shardkit.bench.train_step import TrainStep

    device = torch.device("cuda")
    steps: dict[str, Any] = {}
    for name in args.variants:
        t0 = time.perf_counter()
        if name == "previous":
            steps[name] = PreviousStep(args.model, classes, device)
        else:
            steps[name] = TrainStep(args.model, classes, device,
                                    compile_mode=None if name == "default" else name)
        timed(steps[name], cycle(batches), args.warmup)  # compile
        log(f"variant {name}: compiled and warmed in {time.perf_counter() - t0:.0f} s")
    rates: dict[str, list[float]] = {n: [] for n in steps}
    issue: dict[str, list[float]] = {n: [] for n in steps}
    for r in range(args.rounds + 1):
        for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            timed(steps[name], cycle(batches), args.warmup)
            seconds, per_call = timed(steps[name], cycle(batches), args.steps)
            rates[name].append(args.steps * args.batch_size / seconds)
            issue[name].append(per_call * 1e3)
            log(f"variant {name} round {r + 1}: {rates[name][-1]:,.0f} img/s, {1e3 * seconds / args.steps:.2f} ms "
                f"per step, issue {issue[name][-1]:.2f} ms")
    out = {}
    for name, step in steps.items():
        gpu = device_ms(functools.partial(step, *batches[0]), 20, device)
        out[name] = {"images_per_second": rates[name], "issue_ms": issue[name], "device_ms": gpu}
        wall = 1e3 * args.batch_size / statistics.median(rates[name])
        log(f"variant {name}: {spread(rates[name])} img/s, step {wall:.2f} ms wall, {gpu:.2f} ms device, "
            f"{statistics.median(issue[name]):.2f} ms to issue")
    del steps
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("imagefolder")
    parser.add_argument("shards")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=176)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--dali-threads", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--terms", default=",".join(DEFAULT_TERMS))
    parser.add_argument("--variants", default="previous,default,reduce-overhead",
                        help="step variants to time after the terms (empty: none)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    terms = [t for t in args.terms.split(",") if t]
    from shardkit.bench.conditions import describe_imagefolder
    from shardkit.bench.dali import dali_available
    from shardkit.bench.train import TrainStep

    if not dali_available():
        dropped = [t for t in terms if t.startswith("dali")]
        terms = [t for t in terms if t not in dropped]
        if dropped:
            log(f"no DALI here: leaving out {', '.join(dropped)}")
    classes = describe_imagefolder(args.imagefolder)["classes"]
    spec = {"imagefolder": args.imagefolder, "shards": args.shards, "batch_size": args.batch_size,
            "size": args.size, "workers": args.workers, "dali_threads": args.dali_threads, "decode_batches": 4}
    report: dict[str, Any] = {"args": vars(args), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                              "cpus": os.cpu_count()}
    batches = device_batches(args.imagefolder, args.batch_size, args.size, 4, classes)
    ctx = multiprocessing.get_context("spawn")
    step = TrainStep(args.model, classes, torch.device("cuda"))
    t0 = time.perf_counter()
    timed(step, cycle(batches), args.warmup)
    log(f"step compiled in {time.perf_counter() - t0:.0f} s")
    sides = {t: Side(t, spec, ctx) for t in terms if t != "alone" and t not in FED}
    for name, side in sides.items():
        side.wait_ready()
        if side.error:
            log(f"term {name}: could not start: {side.error}")
    results: dict[str, dict[str, list[float]]] = {t: {"rate": [], "ratio": [], "kept": []} for t in terms}
    errors: dict[str, str] = {n: s.error for n, s in sides.items() if s.error}
    for r in range(args.rounds):
        order = terms if r % 2 == 0 else terms[::-1]
        alone = None
        for term in ["alone", *[t for t in order if t != "alone"]]:
            if term in errors:
                continue
            try:
                if term in FED:
                    loader = build_loader(term, spec)
                    try:
                        fed = map(step_to_device, forever(loader))
                        timed(step, fed, args.warmup + args.steps)  # lead-in
                        seconds, _ = timed(step, fed, args.steps)
                    finally:
                        close = getattr(loader, "close", None)
                        if close is not None:
                            close()
                        del loader
                    kept = float("nan")
                elif term == "alone":
                    timed(step, cycle(batches), args.warmup)
                    seconds, _ = timed(step, cycle(batches), args.steps)
                    kept = float("nan")
                else:
                    side = sides[term]
                    side.start()
                    timed(step, cycle(batches), args.warmup, side.tick)
                    before = side.done.value
                    seconds, _ = timed(step, cycle(batches), args.steps, side.tick)
                    paced = side.kind not in ("gil", "cpu")
                    kept = (side.done.value - before) / args.steps if paced else float("nan")
                    side.pause()
            except Exception as err:  # noqa: BLE001 - one term's failure is reported, the rest run
                errors[term] = repr(err)
                log(f"term {term}: failed: {err!r}")
                continue
            rate = args.steps * args.batch_size / seconds
            if term == "alone":
                alone = rate
            results[term]["rate"].append(rate)
            results[term]["ratio"].append(rate / alone if alone else float("nan"))
            results[term]["kept"].append(kept)
            log(f"round {r + 1} {term:<22} {rate:8,.0f} img/s  {rate / alone if alone else float('nan'):5.0%} of alone"
                f"  kept {kept:.2f}")
        if args.out:
            Path(args.out).write_text(json.dumps({**report, "terms": results, "errors": errors}, indent=1))
    for side in sides.values():
        side.close()
    report.update(terms=results, errors=errors)
    if args.variants:  # last: their GPU times come from torch.profiler, which slows every launch after it
        del step
        torch.cuda.empty_cache()
        report["variants"] = variants(args, batches, classes)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\n{args.model} @{args.size}, batch {args.batch_size}, {args.steps} timed steps x {args.rounds} rounds, "
          f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs")
    print(f"{'term':<22} {'img/s':>24} {'of alone':>16} {'kept':>6}")
    for term, row in results.items():
        if row["rate"]:
            kept = statistics.median(row["kept"])
            print(f"{term:<22} {spread(row['rate']):>24} {spread(row['ratio'], '{:.0%}'):>16} "
                  f"{'' if kept != kept else f'{kept:.2f}':>6}")
    for term, failure in errors.items():
        print(f"{term:<22} failed: {failure}")


def step_to_device(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels, *_ = batch
    return images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)


if __name__ == "__main__":
    main()
