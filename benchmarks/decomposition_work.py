"""The pieces of a loader's work that :mod:`benchmarks.step_decomposition` runs beside the training
step, one *term* at a time: the data (pre-decoded device batches, the tree's JPEGs), the paced
work of a term (an H2D copy, nvJPEG decode, the route's resize kernel, both) in a thread or another
process, host load (a GIL-holding thread, busy processes), and the loaders themselves (ShardLoader,
DALI). The terms are described in that module's docstring.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["PACED", "Side", "build_loader", "device_batches", "forever"]

#: Terms that do one unit of work per step and wait for it.
PACED = ("h2d", "decode", "resize", "route")


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
        loader = build_loader("shardloader", spec)
        batches = forever(loader)
        while not loader.settled:  # its trial, on the loader alone (no step beside it yet); then it stays
            next(batches)
        return lambda: next(batches)
    if kind == "dali_pipeline":
        batches = forever(build_loader("dali", spec))
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
        loader = ShardLoader(spec["shards"], batch_size=spec["batch_size"], transform=bf16,
                             num_workers=spec["workers"], device="cuda", drop_last=True, feeders="auto")
        loader.wait_for_feeders()  # started now (its trial then runs in the batches taken first)
        return loader
    reader, source = ("webdataset", spec["shards"]) if name == "dali" else ("file", spec["imagefolder"])
    return DaliTrainLoader(reader, source, size=spec["size"], batch_size=spec["batch_size"],
                           threads=spec["dali_threads"], device="cuda")


def forever(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader
