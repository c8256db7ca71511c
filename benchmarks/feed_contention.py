"""What a GPU loader costs a host-bound training step, and where: the step's rate under each load.

The compiled ResNet step runs on one fixed on-device batch (the *synthetic* step) while, in turn:

- ``idle``: nothing else runs;
- ``fed``: no fixed batch, the step is fed by ShardLoader's GPU route in this process (what
  ``shardkit bench --train`` measures);
- ``thread``: the same GPU route runs in a thread of this process, its batches thrown away (its
  GIL, CPU and GPU work, without the step waiting for it);
- ``process``: the same GPU route runs in another process (its own interpreter and CUDA context),
  batches thrown away (its CPU and GPU work, no GIL shared);
- ``ipc``: the step is fed by the route running in another process, through a ring of device
  buffers shared by CUDA IPC, ordered by interprocess CUDA events (no host synchronisation);
- ``fed_switch``: ``fed`` with ``sys.setswitchinterval(--switch)`` (faster GIL hand-offs).

Each condition runs ``--steps`` timed steps after ``--warmup``, conditions in alternating order,
``--rounds`` times; the table gives each condition's median rate (min-max) and its share of
``idle``. Loaders are built once and paused between conditions.

Usage (from the repository root, CUDA)::

    PYTHONPATH=. python benchmarks/feed_contention.py /tmp/shards --model resnet18 --size 176
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from shardkit import ShardLoader, transforms
from shardkit.bench.train import TrainStep, _forever

CONDITIONS = ("idle", "fed", "thread", "process", "ipc", "fed_switch", "alone")
IDLE, BURN, IPC, STOP = range(4)


def build_loader(args: argparse.Namespace, workers: int) -> ShardLoader:
    tf = transforms.imagenet_train(args.size, normalize=True, dtype=torch.bfloat16, channels_last=True)
    return ShardLoader(args.shards, batch_size=args.batch_size, transform=tf, num_workers=workers,
                       device="cuda", drop_last=True)


def child(args: argparse.Namespace, mode: Any, setup: Any, conn: Any, produced: Any) -> None:
    """A producer process: the GPU route, idle, thrown away (BURN) or fed into its ring (IPC)."""
    torch.cuda.set_device(0)
    loader = build_loader(args, args.workers // args.producers)
    batches = _forever(loader)
    images, labels = next(batches)
    ring = [(torch.empty_like(images), torch.empty_like(labels)) for _ in range(args.ring)]
    ready = [torch.cuda.Event(interprocess=True) for _ in range(args.ring)]
    setup.put((ring, [e.ipc_handle() for e in ready]))
    released = [torch.cuda.Event.from_ipc_handle(torch.device("cuda", 0), h) for h in conn.recv()]
    stream = torch.cuda.current_stream()
    while True:
        m = mode.value
        if m == STOP:
            break
        if m == IDLE:
            while conn.poll():  # stale free slots
                conn.recv()
            time.sleep(0.001)
            continue
        images, labels = next(batches)
        produced.value += 1
        if m == IPC:
            if not conn.poll(0.5):
                continue
            k = conn.recv()
            stream.wait_event(released[k])
            ring[k][0].copy_(images, non_blocking=True)
            ring[k][1].copy_(labels, non_blocking=True)
            ready[k].record(stream)
            conn.send(k)
    loader.close()


class Background:
    """The in-process loader, drained by a thread while ``on`` is set; ``next`` for the fed runs."""

    def __init__(self, loader: ShardLoader) -> None:
        self.batches = _forever(loader)
        self.lock = threading.Lock()
        self.on = threading.Event()
        self.stop = False
        self.thread = threading.Thread(target=self._drain, daemon=True, name="drain")
        self.thread.start()

    def next(self) -> Any:
        with self.lock:
            return next(self.batches)

    def _drain(self) -> None:
        while not self.stop:
            if not self.on.wait(0.1):
                continue
            self.next()


def timed(step: TrainStep, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], steps: int, warmup: int,
          batch_size: int) -> float:
    for _ in range(warmup):
        step(*next(batches))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(*next(batches))
    torch.cuda.synchronize()
    return steps * batch_size / (time.perf_counter() - t0)


class Producer:
    """The parent's side of one producer process: its ring, events and pipe."""

    def __init__(self, args: argparse.Namespace, tctx: Any, device: torch.device) -> None:
        self.mode, self.produced = tctx.Value("i", IDLE), tctx.Value("l", 0)
        setup = tctx.Queue()
        self.conn, theirs = tctx.Pipe()
        self.proc = tctx.Process(target=child, args=(args, self.mode, setup, theirs, self.produced))
        self.proc.start()
        self.ring, handles = setup.get(timeout=240)
        self.ready = [torch.cuda.Event.from_ipc_handle(device, h) for h in handles]
        self.released = [torch.cuda.Event(interprocess=True) for _ in range(args.ring)]
        self.conn.send([e.ipc_handle() for e in self.released])
        self.n = args.ring

    def start(self) -> None:
        for k in range(self.n):
            self.conn.send(k)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shards")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ring", type=int, default=4)
    p.add_argument("--switch", type=float, default=2e-4)
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    args = p.parse_args()
    conditions = args.conditions.split(",")
    device = torch.device("cuda", 0)

    import torch.multiprocessing as tmp
    tctx = tmp.get_context("spawn")
    producers = [Producer(args, tctx, device) for _ in range(args.producers)]
    loader = build_loader(args, args.workers)
    bg = Background(loader)
    first = bg.next()
    step = TrainStep(args.model, len(loader.classes or ()) or 1000, device)
    fixed = (first[0].clone(), first[1].clone())

    def synthetic() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield fixed

    def fed() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield bg.next()

    current = torch.cuda.current_stream()

    def ipc() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for pr in producers:
            pr.start()
        last: tuple[Producer, int] | None = None
        i = 0
        while True:
            pr = producers[i % len(producers)]
            i += 1
            k = pr.conn.recv()
            current.wait_event(pr.ready[k])
            if last is not None:  # the previous slot is free once the step enqueued after it is done
                lp, lk = last
                lp.released[lk].record(current)
                lp.conn.send(lk)
            last = pr, k
            yield pr.ring[k]

    results: dict[str, list[float]] = {c: [] for c in conditions}
    made: dict[str, list[float]] = {c: [] for c in conditions}
    timed(step, synthetic(), 5, 30, args.batch_size)  # compile and warm up
    for r in range(args.rounds):
        order = conditions if r % 2 == 0 else list(reversed(conditions))
        for c in order:
            sys.setswitchinterval(args.switch if c == "fed_switch" else 0.005)
            if c == "thread":
                bg.on.set()
            for pr in producers:
                pr.mode.value = {"process": BURN, "alone": BURN, "ipc": IPC}.get(c, IDLE)
            before = sum(pr.produced.value for pr in producers)
            t0 = time.perf_counter()
            if c == "alone":
                time.sleep(3.0)
                rate = float("nan")
            else:
                source = {"idle": synthetic, "thread": synthetic, "process": synthetic, "fed": fed,
                          "fed_switch": fed, "ipc": ipc}[c]()
                rate = timed(step, source, args.steps, args.warmup, args.batch_size)
            prod = (sum(pr.produced.value for pr in producers) - before) * args.batch_size / (time.perf_counter() - t0)
            bg.on.clear()
            for pr in producers:
                pr.mode.value = IDLE
            time.sleep(0.3)
            for pr in producers:  # drain hand-offs left in the pipes
                while pr.conn.poll(0.05):
                    pr.conn.recv()
            results[c].append(rate)
            made[c].append(prod)
            print(f"round {r} {c:<11} step {rate:>9,.0f} img/s   producers {prod:>9,.0f} img/s", flush=True)
    sys.setswitchinterval(0.005)
    idle = statistics.median(results["idle"]) if "idle" in results else float("nan")
    print(f"\n{args.model} @{args.size}, batch {args.batch_size}, {args.workers} workers, "
          f"{args.producers} producer(s), ring {args.ring}, {args.steps} steps x {args.rounds} rounds")
    for c in conditions:
        xs, ps = results[c], made[c]
        med = statistics.median(xs)
        print(f"{c:<11} {med:>9,.0f} img/s ({min(xs):,.0f}-{max(xs):,.0f})  share {med / idle:.0%}  "
              f"producers {statistics.median(ps):,.0f} img/s")
    for pr in producers:
        pr.mode.value = STOP
    bg.stop = True
    for pr in producers:
        pr.proc.join(timeout=30)
    loader.close()


if __name__ == "__main__":
    main()
