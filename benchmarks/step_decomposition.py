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
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

PACED = ("h2d", "decode", "resize", "route")
FED = ("shardloader", "dali", "dali_files")
DEFAULT_TERMS = ("alone", "h2d@thread", "h2d@process", "decode@thread", "decode@process", "resize@thread",
                 "resize@process", "route@thread", "route@process", "gil", "cpu", "shardloader_beside",
                 "shardloader", "dali_decode@thread", "dali_pipeline@thread", "dali", "dali_files")


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data


def jpegs(root: str, n: int) -> list[torch.Tensor]:
    """``n`` of the tree's JPEGs that nvJPEG decodes (sorted paths), as uint8 CPU tensors."""
    from shardkit.codec.nvjpeg import nvjpeg_friendly

    out: list[torch.Tensor] = []
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if nvjpeg_friendly(data):
                out.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
                if len(out) == n:
                    break
    if len(out) < n:
        raise ValueError(f"{root} has {len(out)} JPEGs nvJPEG decodes, {n} needed")
    return out


class Resize:
    """The route's GPU half after decode, on fixed decoded images: crop-resize-flip (one kernel)
    and normalisation to bf16 ``channels_last``."""

    def __init__(self, images: list[torch.Tensor], size: int, seed: int = 0) -> None:
        import random

        from shardkit import transforms
        from shardkit.transforms.batch import BatchFormat
        from shardkit.transforms.gpu import geometry_rows

        t, rng = transforms.imagenet_train(size), random.Random(seed)
        sizes = [(int(im.shape[1]), int(im.shape[2])) for im in images]
        device = images[0].device
        self.geom = geometry_rows(sizes, [t.sample_params(h, w, rng) for h, w in sizes], (size, size)).to(device)
        self.flat = torch.cat([im.reshape(-1) for im in images])
        self.offsets = torch.tensor([0] + [im.numel() for im in images[:-1]]).cumsum(0).to(device)
        self.size = size
        self.format = BatchFormat.make(True, torch.bfloat16, True)

    def __call__(self) -> torch.Tensor:
        from shardkit.transforms.gpu import crop_resize_flip_batch

        return self.format(crop_resize_flip_batch(self.flat, self.offsets, self.geom, (self.size, self.size)))


def decode(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    from torchvision.io import decode_jpeg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return decode_jpeg(batch, device="cuda")


def device_batches(root: str, batch_size: int, size: int, count: int, classes: int
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` pre-decoded batches on the device: the tree's JPEGs through the route's decode and
    kernel, bf16 ``channels_last``, with random labels."""
    files = jpegs(root, batch_size * count)
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(count):
        images = Resize(decode(files[k * batch_size:(k + 1) * batch_size]), size, seed=k)()
        out.append((images, torch.randint(0, classes, (batch_size,), generator=g).cuda()))
    torch.cuda.synchronize()
    return out


# ---------------------------------------------------------------- side work


def make_work(kind: str, spec: dict[str, Any]) -> Callable[[], object]:
    """One unit of a paced term's work (made in the thread or process that runs it)."""
    b, size = spec["batch_size"], spec["size"]
    if kind == "h2d":
        pinned = torch.randint(0, 256, (b, 3, size, size), dtype=torch.uint8).pin_memory()
        dst = torch.empty_like(pinned, device="cuda")
        return lambda: dst.copy_(pinned, non_blocking=True)
    files = jpegs(spec["imagefolder"], b * spec["decode_batches"])
    chunks = [files[k * b:(k + 1) * b] for k in range(spec["decode_batches"])]
    if kind == "decode":
        turn = iter(range(1 << 62))
        return lambda: decode(chunks[next(turn) % len(chunks)])
    resizes = [Resize(decode(chunk), size, seed=k) for k, chunk in enumerate(chunks)]
    torch.cuda.synchronize()
    if kind == "resize":
        turn = iter(range(1 << 62))
        return lambda: resizes[next(turn) % len(resizes)]()
    if kind == "route":
        turn = iter(range(1 << 62))

        def route() -> torch.Tensor:
            k = next(turn)
            images = decode(chunks[k % len(chunks)])
            again = resizes[k % len(resizes)]  # geometry made for these images' sizes
            again.flat = torch.cat([im.reshape(-1) for im in images])
            return again()
        return route
    raise ValueError(kind)


def serve(work: Callable[[], object], tokens: Any, stop: Any, done: Any, ready: Any, errors: Any) -> None:
    """A paced term's loop: one unit of ``work`` per token, on a stream of its own, waited for."""
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            work()
        stream.synchronize()
    except Exception as err:  # noqa: BLE001 - reported with the term
        errors.put(repr(err))
        ready.set()
        return
    ready.set()
    while not stop.is_set():
        if not tokens.acquire(timeout=0.05):
            continue
        with torch.cuda.stream(stream):
            work()
        stream.synchronize()
        with done.get_lock():
            done.value += 1


def side_process(kind: str, spec: dict[str, Any], tokens: Any, stop: Any, done: Any, ready: Any,
                 errors: Any) -> None:
    try:
        work = make_work(kind, spec)
    except Exception as err:  # noqa: BLE001
        errors.put(repr(err))
        ready.set()
        return
    serve(work, tokens, stop, done, ready, errors)


def spin_process(stop: Any) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


class Side:
    """A term's side work: started once, idle until :meth:`start`, paused by :meth:`pause`."""

    def __init__(self, name: str, spec: dict[str, Any], ctx: Any) -> None:
        self.name, self.ctx = name, ctx
        kind, _, where = name.partition("@")
        self.kind, self.where = kind, where or "thread"
        self.tokens = ctx.Semaphore(0)
        self.stop = ctx.Event()  # ends the side for good
        self.active = threading.Event()
        self.done = ctx.Value("q", 0)
        self.ready = ctx.Event()
        self.errors = ctx.Queue()
        self.error: str | None = None
        self.spinners: list[Any] = []
        if self.kind in PACED and self.where == "process":
            self.proc = ctx.Process(target=side_process, args=(self.kind, spec, self.tokens, self.stop, self.done,
                                                               self.ready, self.errors), daemon=True)
            self.proc.start()
        elif self.kind in PACED:
            threading.Thread(target=lambda: self._thread(lambda: make_work(self.kind, spec)), daemon=True).start()
        elif self.kind in ("dali_decode", "dali_pipeline", "shardloader_beside"):
            threading.Thread(target=lambda: self._thread(lambda: _iterate(self.kind, spec)), daemon=True).start()
        elif self.kind in ("gil", "cpu"):
            self.spec = spec
            self.ready.set()
        else:
            raise ValueError(f"unknown term {name!r}")

    def _thread(self, make: Callable[[], Callable[[], object]]) -> None:
        try:
            work = make()
        except Exception as err:  # noqa: BLE001
            self.errors.put(repr(err))
            self.ready.set()
            return
        serve(work, self.tokens, self.stop, self.done, self.ready, self.errors)

    def wait_ready(self, timeout: float = 600) -> None:
        self.ready.wait(timeout)
        try:
            self.error = self.errors.get(timeout=0.5)
        except Exception:  # noqa: BLE001 - empty
            self.error = None

    def start(self) -> None:
        self.active.set()
        if self.kind == "gil":
            self._gil_stop = threading.Event()

            def spin() -> None:
                while not self._gil_stop.is_set():
                    for _ in range(1000):
                        pass
            self.spinners = [threading.Thread(target=spin, daemon=True)]
            self.spinners[0].start()
        elif self.kind == "cpu":
            self._cpu_stop = self.ctx.Event()
            self.spinners = [self.ctx.Process(target=spin_process, args=(self._cpu_stop,), daemon=True)
                             for _ in range(self.spec["workers"])]
            for p in self.spinners:
                p.start()
            time.sleep(4.0)  # the spawned interpreters start spinning

    def tick(self) -> None:
        if self.kind in PACED or self.kind in ("dali_decode", "dali_pipeline", "shardloader_beside"):
            self.tokens.release()

    def pause(self) -> None:
        self.active.clear()
        if self.kind == "gil":
            self._gil_stop.set()
        elif self.kind == "cpu":
            self._cpu_stop.set()
        for s in self.spinners:
            s.join(timeout=10)
        self.spinners = []
        while self.tokens.acquire(timeout=0.01):  # undo the tokens it did not get to
            pass

    def close(self) -> None:
        self.stop.set()


def _iterate(kind: str, spec: dict[str, Any]) -> Callable[[], object]:
    """DALI's decoder alone, DALI's training pipeline, or ShardLoader: one batch per call."""
    if kind == "shardloader_beside":
        batches = _forever(build_loader("shardloader", spec))
        return lambda: next(batches)
    if kind == "dali_pipeline":
        batches = _forever(build_loader("dali", spec))
        return lambda: next(batches)
    from nvidia.dali import fn, pipeline_def, types

    from shardkit.bench.baselines import IMAGE_KEYS
    from shardkit.bench.dali import _webdataset_inputs

    tars, indexes = _webdataset_inputs(spec["shards"])

    @pipeline_def(batch_size=spec["batch_size"], num_threads=spec["dali_threads"], device_id=0, seed=0,
                  prefetch_queue_depth=2)
    def decoder() -> Any:
        jpeg, _label = fn.readers.webdataset(paths=tars, index_paths=indexes or None, ext=[IMAGE_KEYS, "cls"],
                                             random_shuffle=True, name="reader")
        return fn.decoders.image_random_crop(jpeg, device="mixed", output_type=types.RGB,
                                             device_memory_padding=211025920, host_memory_padding=140544512,
                                             random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                             num_attempts=10)

    pipe = decoder()
    pipe.build()
    return lambda: pipe.run()


# ---------------------------------------------------------------- loaders and steps


def build_loader(name: str, spec: dict[str, Any]) -> Any:
    from shardkit import transforms
    from shardkit.bench.dali import DaliTrainLoader
    from shardkit.loader import ShardLoader

    if name == "shardloader":
        bf16 = transforms.imagenet_train(spec["size"], normalize=True, dtype=torch.bfloat16, channels_last=True)
        return ShardLoader(spec["shards"], batch_size=spec["batch_size"], transform=bf16,
                           num_workers=spec["workers"], device="cuda", drop_last=True, feeders="auto")
    reader, source = ("webdataset", spec["shards"]) if name == "dali" else ("file", spec["imagefolder"])
    return DaliTrainLoader(reader, source, size=spec["size"], batch_size=spec["batch_size"],
                           threads=spec["dali_threads"], device="cuda")


def _forever(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


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
                        fed = map(step_to_device, _forever(loader))
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
