"""The GPU route alone: time to the first batch, and CPU time per image by process.

One ``ShardLoader(device="cuda")`` (ResNet training preset at ``--size``, bf16 ``channels_last``,
``--workers`` workers, ``--feeders``) in this process after torch, shardkit and the CUDA context
are up: the seconds the constructor takes, the seconds from ``iter()`` to the first batch on
the device (with ``--feeders auto`` it comes from the training process while the feeders start;
the script then waits for them, ``wait_for_feeders``, and says when they were up), then the
rate over ``--batches`` batches after 30 untimed ones (epoch after epoch) and
the CPU seconds per image each kind of process spent meanwhile: this one (the training process),
its feeders and forkserver, and the workers (``psutil``, user + system; the processes alive at
the end of the timed batches). Feeders are told from workers by the forkserver the loader
starts: where the workers of ``--feeders 0`` are started by a forkserver too (Python 3.14's
default start method, or a script's ``set_start_method("forkserver")``), they count as feeders.
The training process's and the feeders' CPU is also given thread by thread, the busiest
``--threads`` of each kind, by name: a thread's Python name in the training process where it has
one, else the name the OS has for it (the loader names its threads for the OS too: ``sk-fetch``,
``sk-decode``, ``sk-augment``); the feeders' threads of one name are added up over the feeders.

``--sleep-waits`` makes this process's CUDA context wait for the device by sleeping
(:func:`~shardkit.loader.feed.cuda_sync.sleep_while_waiting`, as each feeder's does) before the
context exists: set beside a run without it, what the training process spends spinning in its
waits (``cudaStreamSynchronize``, events, nvJPEG's batched decode).

    python -m benchmarks.route_cost /tmp/shards --workers 16 --feeders 0 --batches 150
    python -m benchmarks.route_cost /tmp/shards --workers 16 --feeders 0 --batches 150 --sleep-waits

``--compile-at-first-batch`` (with ``--feeders 0``) leaves the crop-resize kernel's compile to the
first batch, as before the route started it when the workers run: set beside a run without it,
each with an empty ``TRITON_CACHE_DIR``, what compiling ahead saves the first batch.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import torch

from shardkit import GpuOptions, ShardLoader
from shardkit.codec.backend import prefer_decoder
from shardkit.loader.feed.cuda_sync import sleep_while_waiting
from shardkit.loader.routes.base import Route
from shardkit.loader.routes.gpu.route import GpuRoute
from shardkit.transforms import imagenet_train


def _kind(p: psutil.Process, me: psutil.Process) -> str:
    """Where ``p`` sits: the training process; a feeder (a child of the forkserver the loader
    started, or the server itself); a worker (a child of a feeder, or of the training process);
    ``other`` (multiprocessing's resource tracker)."""
    if p.pid == me.pid:
        return "training process"
    line = " ".join(p.cmdline())
    parent = p.parent()
    if "resource_tracker" in line:
        return "other"
    if "forkserver" in line and parent is not None and parent.pid == me.pid:
        return "feeders"
    grand = parent.parent() if parent is not None else None
    if parent is not None and grand is not None and grand.pid == me.pid and "forkserver" in " ".join(parent.cmdline()):
        return "feeders"
    return "workers"


def _cpu_by_kind(me: psutil.Process) -> dict[int, tuple[str, float]]:
    """``pid -> (kind, CPU seconds)`` of this process and its descendants."""
    out: dict[int, tuple[str, float]] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            times = p.cpu_times()
            out[p.pid] = (_kind(p, me), times.user + times.system)
        except psutil.Error:
            continue
    return out


def _thread_cpu(processes: list[psutil.Process]) -> dict[tuple[int, int], float]:
    """``(pid, thread id) -> CPU seconds`` of the threads of ``processes``."""
    out: dict[tuple[int, int], float] = {}
    for p in processes:
        try:
            out.update({(p.pid, t.id): t.user_time + t.system_time for t in p.threads()})
        except psutil.Error:
            continue
    return out


def _thread_name(pid: int, tid: int) -> str:
    """A thread's Python name where it is a Python thread of this process, else the OS's name for it."""
    if pid == os.getpid():
        for t in threading.enumerate():
            if t.native_id == tid:
                return t.name
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shards")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--feeders", default="auto", help="'auto' or a number")
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--size", type=int, default=176)
    ap.add_argument("--threads", type=int, default=6,
                    help="busiest threads to list, of the training process and of the feeders")
    ap.add_argument("--sleep-waits", action="store_true", help="this process's CUDA waits sleep, not spin")
    ap.add_argument("--decoder", choices=["torchvision", "torchcodec"], default=None,
                    help="the GPU decoder's library (default: shardkit's order, torchvision first)")
    ap.add_argument("--decode-threads", type=int, default=1, help="GpuOptions.decode_threads")
    ap.add_argument("--compile-at-first-batch", action="store_true",
                    help="with --feeders 0: the kernel compiles at the first batch, not while the workers start")
    args = ap.parse_args()
    feeders: int | str = args.feeders if args.feeders == "auto" else int(args.feeders)
    if args.compile_at_first_batch:
        if feeders != 0:
            raise SystemExit("--compile-at-first-batch needs --feeders 0 (feeders run the route elsewhere)")
        GpuRoute.workers_started = Route.workers_started  # type: ignore[method-assign]
    if args.sleep_waits and not sleep_while_waiting(0):  # device 0: the first visible one, cuda:0
        raise SystemExit("--sleep-waits: the CUDA driver refused blocking waits (run with logging at DEBUG for why)")
    torch.zeros(1, device="cuda")  # the CUDA context, as a training script has one before its loader
    transform = imagenet_train(args.size, normalize=True, dtype=torch.bfloat16, channels_last=True)

    prefer_decoder(args.decoder)
    t0 = time.perf_counter()
    loader = ShardLoader(args.shards, batch_size=args.batch_size, transform=transform, num_workers=args.workers,
                         device="cuda", drop_last=True, feeders=feeders,
                         gpu=GpuOptions(decode_threads=args.decode_threads))
    t1 = time.perf_counter()
    epoch = iter(loader)
    next(epoch)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    loader.wait_for_feeders()  # feeders="auto": its feeders start behind the first batches; time them in place
    t3 = time.perf_counter()

    def forever() -> Iterator[Any]:
        nonlocal epoch
        while True:
            try:
                yield next(epoch)
            except StopIteration:
                epoch = iter(loader)

    batches = forever()
    for _ in range(30):
        next(batches)
    while not loader.settled:  # feeders="auto": its trial done, what is timed is where it stays
        next(batches)
    torch.cuda.synchronize()
    me = psutil.Process()
    feeders_now = [psutil.Process(pid) for pid, (kind, _) in _cpu_by_kind(me).items() if kind == "feeders"]
    watched = [me, *feeders_now]
    before, threads_before, w0 = _cpu_by_kind(me), _thread_cpu(watched), time.perf_counter()
    for _ in range(args.batches):
        next(batches)
    torch.cuda.synchronize()
    wall, after, threads_after = time.perf_counter() - w0, _cpu_by_kind(me), _thread_cpu(watched)
    images = args.batches * args.batch_size
    kinds: dict[str, list[float]] = {}
    for pid, (kind, cpu) in after.items():
        row = kinds.setdefault(kind, [0.0, 0])
        row[0] += cpu - before.get(pid, (kind, 0.0))[1]
        row[1] += 1
    total = sum(cpu for cpu, _ in kinds.values())
    print(f"feeders={loader.feeders} workers={args.workers}: constructor {t1 - t0:.2f} s, first batch {t2 - t1:.2f} s "
          f"after iter() ({t2 - t0:.2f} s in all; feeders up {t3 - t0:.2f} s after the constructor was called); "
          f"{images / wall:,.0f} img/s; CPU {1e3 * total / images:.3f} ms per image ({total / wall:.1f} cores busy)"
          + ("; this process's CUDA waits sleep" if args.sleep_waits else "")
          + ("; kernel compiled at the first batch" if args.compile_at_first_batch else "")
          + (f"; decoder {args.decoder} x{args.decode_threads}" if args.decoder else ""))
    for kind, (cpu, count) in sorted(kinds.items()):
        print(f"  {kind}: {count} processes, {1e3 * cpu / images:.3f} ms per image")
    by_name: dict[tuple[str, str], float] = {}
    for (pid, tid), cpu in threads_after.items():
        key = ("training process" if pid == me.pid else "feeders", _thread_name(pid, tid))
        by_name[key] = by_name.get(key, 0.0) + cpu - threads_before.get((pid, tid), 0.0)
    for kind in ("training process", "feeders"):
        spent = sorted(((cpu, name) for (k, name), cpu in by_name.items() if k == kind), reverse=True)
        for cpu, name in spent[:args.threads]:
            print(f"    {kind}, thread {name!r}: {1e3 * cpu / images:.3f} ms per image")
    loader.close()


if __name__ == "__main__":
    main()
