"""How the epoch plan scales: peak memory and time of one worker's plan, on synthetic manifests.

The plan (``shardkit.loader.epochs.plan``) is pure, so no image data is needed: a manifest is just a list
of shard sizes. For each (samples, shards, world size) this measures, every time in a child process
forked from this one (so its peak RSS, less its RSS at the fork, is the plan's own memory), with
``batch_size=256``, ``window=8``, ``shuffle=True``, ``drop_last=False`` and 8 workers per rank:

- ``first``: what the loader's constructor and worker 0 of rank 0 do up to the first batch
  (``ShardLoader.__init__`` then ``BatchStream.__iter__``): build the ``PlanConfig`` from the shard
  sizes, the epoch's lazy ``EpochOrder``, the first of ``worker_batch_indices(...)``, its shards,
  indices and sample seeds: time to the first batch's sample indices;
- ``resume``: ``PlanConfig.resume(state)`` (what ``ShardLoader.load_state_dict`` calls) for a state
  at a random epoch and step, then the same as ``first`` from that step on.

``--mix W0 W1``: the shards form two datasets instead (the first ``--split`` of them, then the rest)
mixed with weights ``W0, W1`` (``shardkit.loader.epochs.mix``): the timed part then includes the ``Mix``
(quotas) and each epoch's slices, what ``ShardLoader`` over two datasets adds to the plan.

A child gets ``RLIMIT_AS`` = its address space at the fork + ``--cap-gib``, so a plan that does not
fit ends in MemoryError (reported as such) instead of swapping. A measurement is repeated
``--repeats`` times (median, all runs kept) while it takes under ``--single-above`` seconds.

    python -m benchmarks.bench_plan --samples 1e6 1e8 1e9 5e9 --shards 1e4 1e5 5e5 1e6
    python -m benchmarks.bench_plan --mix 0.7 0.3 --split 0.9 ...
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.mix import Mix
from shardkit.loader.epochs.plan import shard_offsets, worker_batch_indices
from shardkit.loader.epochs.seeds import sample_seeds

WHAT = ("first", "resume")
MIB = 1 << 20


def synthetic_sizes(num_samples: int, num_shards: int, *, jitter: float = 0.2, seed: int = 0) -> list[int]:
    """``num_shards`` shard sizes summing to exactly ``num_samples``, each within about
    ``±jitter`` of the mean (``jitter=0``: equal shards, the first ``num_samples % num_shards``
    one larger)."""
    if not 0 < num_shards <= num_samples:
        raise ValueError(f"need 0 < shards <= samples, got {num_shards} shards, {num_samples} samples")
    weights = np.random.default_rng(seed).uniform(1 - jitter, 1 + jitter, num_shards)
    sizes = np.floor(weights * (num_samples / weights.sum())).astype(np.int64)
    sizes[: num_samples - int(sizes.sum())] += 1  # the rounding remainder, under num_shards
    return sizes.tolist()


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(
    what: str,
    sizes: Sequence[int] | np.ndarray,
    *,
    world_size: int,
    rank: int = 0,
    batch_size: int = 256,
    window: int = 8,
    workers: int = 8,
    seed: int = 0,
    mix: Sequence[float] | None = None,
    split: float = 0.5,
) -> dict[str, Any]:
    """Run one measurement in this process: ``{"seconds", "cpu_seconds", "peak_mib", "ids", ...}``.

    ``peak_mib`` is this process's peak RSS so far (meaningful in a fresh child); ``ids`` are the
    first batch's global sample ids. ``mix``: two weights, for two datasets made of the first
    ``split`` of the shards and the rest.
    """
    if what not in WHAT:
        raise ValueError(f"what must be one of {WHAT}, got {what!r}")
    knobs = dict(seed=seed, shuffle=True, window=window, rank=rank, world_size=world_size,
                 batch_size=batch_size, drop_last=False)
    out: dict[str, Any] = {}
    cut = min(max(1, round(len(sizes) * split)), len(sizes) - 1)

    def config() -> PlanConfig:
        if mix is None:
            return PlanConfig(shard_sizes=sizes, **knobs)  # type: ignore[arg-type]
        joined = Mix([sizes[:cut], sizes[cut:]], mix)
        return PlanConfig(shard_sizes=joined.shard_sizes, mix=joined, **knobs)  # type: ignore[arg-type]

    if what == "resume":  # the loader exists already: only load_state_dict and after is timed
        cfg = config()
        rng = np.random.default_rng([seed, world_size, len(sizes)])
        at = int(rng.integers(0, 100)), int(rng.integers(0, cfg.num_batches))
        state = cfg.state(*at).to_dict()  # what a checkpoint hands back
        out["state"] = {"epoch": at[0], "batches_consumed": at[1]}
        t0, c0 = time.perf_counter(), time.process_time()
        epoch, start, _ = cfg.resume(state)
    else:  # from the loader's constructor (given the manifest's shard sizes) on
        t0, c0 = time.perf_counter(), time.process_time()
        cfg = config()
        epoch, start = 0, 0
    # BatchStream.__iter__ for worker 0 of `workers`, up to its first batch:
    order = cfg.order(epoch)
    j = next(iter(worker_batch_indices(cfg.num_batches, num_workers=workers, worker_id=0, start_batch=start)))
    shards, indices, positions = cfg.batch(order, j)
    sample_seeds(cfg.seed, epoch, positions)
    out["seconds"], out["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    out["ids"] = (shard_offsets(cfg.shard_sizes)[shards] + indices).tolist()
    out["first_shards"] = sorted(set(shards.tolist()))
    out["batch"] = j
    out["peak_mib"] = _rss_mib()
    return out


def run_isolated(what: str, sizes: Sequence[int] | np.ndarray, *, cap_gib: float, **kwargs: Any) -> dict[str, Any]:
    """:func:`measure` in a forked child under ``RLIMIT_AS`` = its address space + ``cap_gib``.

    Adds ``base_mib`` (the child's RSS at the fork) and ``plan_mib`` (peak - base); on a
    MemoryError returns ``{"error": "MemoryError", ...}`` instead.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: measure, write one JSON line, leave without running the parent's cleanup
        code = 0
        try:
            os.close(read_fd)
            base = _rss_mib()
            vm_kib = int(Path("/proc/self/status").read_text().split("VmSize:")[1].split()[0])
            limit = vm_kib * 1024 + int(cap_gib * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            try:
                result = measure(what, sizes, **kwargs)
                result.update(base_mib=base, plan_mib=result["peak_mib"] - base)
            except MemoryError:
                result = {"error": "MemoryError", "base_mib": base, "peak_mib": _rss_mib()}
            with os.fdopen(write_fd, "w") as f:
                f.write(json.dumps(result))
        except BaseException:  # noqa: B036 - anything else: report it, never return into the parent's code
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        raise RuntimeError(f"measuring child {what} failed (wait status {status})")
    return dict(json.loads(text))


def cell(
    what: str, num_samples: int, num_shards: int, world_size: int, *, repeats: int, single_above: float,
    cap_gib: float, jitter: float, mix: Sequence[float] | None = None, split: float = 0.5,
) -> dict[str, Any]:
    """Median over runs of one measurement (one run if the first takes ``single_above`` s or more)."""
    sizes = synthetic_sizes(num_samples, num_shards, jitter=jitter)
    runs: list[dict[str, Any]] = []
    while len(runs) < repeats:
        r = run_isolated(what, sizes, cap_gib=cap_gib, world_size=world_size, mix=mix, split=split)
        if "error" in r:
            return {"error": r["error"], "runs": 1}
        runs.append(r)
        if r["seconds"] >= single_above:
            break
    del sizes
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "seconds_all": [r["seconds"] for r in runs],
        "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
        "cpu_seconds_all": [r["cpu_seconds"] for r in runs],
        "plan_mib": statistics.median(r["plan_mib"] for r in runs),
        "peak_mib": statistics.median(r["peak_mib"] for r in runs),
        "base_mib": runs[0]["base_mib"],
        "runs": len(runs),
    }


def _fmt(c: dict[str, Any], key: str, spec: str) -> str:
    if "error" in c:
        return str(c["error"])
    if key == "seconds":
        low, high = min(c["seconds_all"]), max(c["seconds_all"])
        return f"{c['seconds']:{spec}} [{low:{spec}}-{high:{spec}}] ({c['cpu_seconds']:{spec}})"
    return format(c[key], spec)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_plan",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=float, nargs="+", default=[1e6, 1e8, 1e9, 5e9])
    parser.add_argument("--shards", type=float, nargs="+", default=[1e4, 1e5, 5e5, 1e6])
    parser.add_argument("--world", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--jitter", type=float, default=0.2, help="shard sizes within ± this of the mean")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--single-above", type=float, default=20.0, help="run once if a run takes this long")
    parser.add_argument("--cap-gib", type=float, default=2.0, help="address space a child may add")
    parser.add_argument("--json", type=Path, help="write every cell here as well")
    parser.add_argument("--mix", type=float, nargs=2, metavar=("W0", "W1"),
                        help="two datasets (the first --split of the shards, then the rest) with these weights")
    parser.add_argument("--split", type=float, default=0.5, help="with --mix: the first dataset's share of shards")
    args = parser.parse_args()

    rows = []
    for n in sorted(int(s) for s in args.samples):
        for s in sorted(int(x) for x in args.shards):
            if s > n:
                continue
            for w in args.world:
                row: dict[str, Any] = {"samples": n, "shards": s, "world": w}
                for what in WHAT:
                    row[what] = cell(what, n, s, w, repeats=args.repeats, single_above=args.single_above,
                                     cap_gib=args.cap_gib, jitter=args.jitter, mix=args.mix, split=args.split)
                    print(json.dumps({"samples": n, "shards": s, "world": w, what: row[what]}),
                          file=sys.stderr, flush=True)
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    base = next((r[w]["base_mib"] for r in rows for w in WHAT if "base_mib" in r[w]), float("nan"))
    print(f"RSS of the parent at the fork (torch + shardkit imported): {base:.0f} MiB; "
          "MiB below = peak RSS of the child minus that")
    print("seconds: wall-clock median [min-max] (CPU seconds of the child in brackets)")
    print("| samples | shards | world | MiB (first) | s (first) | MiB (resume) | s (resume) | runs |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        a, b = (r[w] for w in WHAT)
        runs = "/".join(str(x.get("runs", "-")) for x in (a, b))
        print(f"| {r['samples']:.0e} | {r['shards']:.0e} | {r['world']} | {_fmt(a, 'plan_mib', '.0f')} | "
              f"{_fmt(a, 'seconds', '.3f')} | {_fmt(b, 'plan_mib', '.0f')} | {_fmt(b, 'seconds', '.3f')} | {runs} |")


if __name__ == "__main__":
    main()
