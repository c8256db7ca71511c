"""The table of a training bench (:mod:`shardkit.bench.train`, :mod:`shardkit.bench.train_detection`):
one row per loader, median (min–max) over the repetitions, in a terminal's width."""

from __future__ import annotations

import statistics
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from shardkit.bench.finished import interrupted_note
from shardkit.bench.report import counted, spread

if TYPE_CHECKING:
    from shardkit.bench.train import TrainRun

__all__ = ["HOST_BOUND", "against_best_dali", "format_train_table", "rate", "say_if_long", "summarise", "train_table",
           "trial_note", "with_feeders"]

#: A step whose GPU time is under this share of its wall time is called host-bound in the table.
HOST_BOUND = 0.8


def rate(images_per_second: float) -> str:
    """An images/s figure: whole numbers from 100 on, one decimal below (a detector on the CPU).

    Example:
        >>> rate(1234.5), rate(6.27)
        ('1,234', '6.3')
    """
    return f"{images_per_second:,.0f}" if images_per_second >= 100 else f"{images_per_second:.1f}"


def train_table(title: str, results: list[dict[str, Any]], batch_size: int, width: int | None = None,
                interrupted: Mapping[str, Any] | None = None) -> str:
    """``title`` over one row per contender of ``results`` (a report's): median (min–max) of each
    figure over the repetitions (the value alone after one). ``step ms``: the synthetic step's
    wall time, with its GPU time in brackets where measured (CUDA; much less: host-bound).
    ``interrupted``: the report's mark of a bench stopped part-way, said under the title
    (:func:`interrupted_note`). In ``width`` columns (a terminal's), each contender as a block of
    short lines instead when the table is wider, the notes wrapped."""

    def cell(s: dict[str, Any], fmt: Callable[[float], str]) -> str:
        return fmt(s["median"]) if len(s["runs"]) == 1 else f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"

    def share(x: float) -> str:
        # over 100%: the fed run outpaced the step on a fixed batch, which only the machine's drift
        # between the runs can do (a CPU run, a busy box): no share to speak of
        return f"{x:.0%}" if x <= 1 else ">100%"

    def ms(x: float | None) -> str:
        return "—" if x is None else f"{x:.1f}"

    rows = []
    host_bound = False
    for r in results:
        wall = 1e3 * batch_size / r["synthetic_images_per_second"]["median"]
        gpu = r.get("step_gpu_ms")
        step = f"{wall:.1f}" if gpu is None else f"{wall:.1f} ({gpu:.1f})"
        host_bound = host_bound or (gpu is not None and gpu < HOST_BOUND * wall)
        rows.append((r["label"], cell(r["fed_images_per_second"], rate), cell(r["synthetic_images_per_second"], rate),
                     cell(r["share"], share), f"{r['host_wait_fraction']['median']:.1%}", step,
                     ms(r["loader_gpu_ms_per_batch"])))
    notes = ["share: the fed rate over the synthetic one (the step on a batch already on the device); host wait: "
             "the part of the fed run the loop spent waiting for its next batch."]
    if any(r.get("step_gpu_ms") is not None for r in results):
        notes.append("step ms: the synthetic step's wall time (GPU time in brackets); loader GPU ms: device "
                     "time of one batch of the loader alone (torch.profiler; — for a loader with feeder processes, "
                     "whose device work is outside this process's profile).")
    over = [f"{r['label']} {cell(r['fed_over_best_dali'], lambda x: f'{x:.2f}x')}"
            for r in results if "fed_over_best_dali" in r]
    if over:
        notes.append("Fed rate over the fastest DALI row's in the same repetition: " + "; ".join(over) + ".")
    notes += [note for r in results if (note := trial_note(r, batch_size)) is not None]
    if host_bound:
        notes.append("The step is host-bound (its GPU time is well under its wall time): its Python and kernel "
                     "launches set its pace, and a loader costs it host time (the GIL, CPU) more than GPU time.")
    if any(r["share"]["median"] > 1 for r in results):
        notes.append("A share over 100%: the fed run was faster than the step on a fixed batch, so the machine's "
                     "speed drifted between the runs (a busy or CPU-only machine); the fed rates still compare.")
    name = max(40, *(len(r[0]) for r in rows))  # the longest label sets the first column
    lines = [f"{'pipeline':<{name}} {'fed img/s':>22} {'synthetic img/s':>22} {'share':>20} {'host wait':>10} "
             f"{'step ms':>14} {'loader GPU ms/batch':>19}"]
    lines += [f"{a:<{name}} {b:>22} {c:>22} {d:>20} {e:>10} {f:>14} {g:>19}" for a, b, c, d, e, f, g in rows]
    stopped = [] if interrupted is None else [interrupted_note(interrupted)]
    if width is None or max(map(len, lines)) <= width:
        return "\n".join([title, *stopped, *lines, *notes])
    blocks = []
    for label, fed, synthetic, share_, wait, step, loader in rows:
        blocks += [label, f"    fed {fed} img/s   synthetic {synthetic} img/s",
                   f"    share {share_}   host wait {wait}",
                   f"    step {step} ms" + ("" if loader == "—" else f"   loader GPU {loader} ms/batch")]
    wrap = textwrap.TextWrapper(width=max(width, 40), subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join([wrap.fill(title), *(wrap.fill(n) for n in stopped), *blocks, *(wrap.fill(n) for n in notes)])


def against_best_dali(results: list[dict[str, Any]], dali: tuple[str, ...]) -> None:
    """Give each contender of ``results`` that is not DALI ``fed_over_best_dali``: in each
    repetition, its fed rate over the fastest DALI row's (``dali``: the DALI contenders' names, a
    thread count after an ``@`` allowed) in the same repetition, as a spread; nothing where no DALI
    row ran. The ratio a user comparing the two loaders on one machine would take.

    A row's i-th run is repetition i's (every contender runs once a repetition, so a bench stopped
    part-way leaves each row the first ones): the pairs are taken over the repetitions that every
    DALI row and the contender finished, and a row with none gets no ratio.

    Example:
        >>> rows = [{"name": "shardloader", "fed_images_per_second": {"runs": [12.0, 11.0]}},
        ...         {"name": "dali_files@8", "fed_images_per_second": {"runs": [10.0, 8.0]}},
        ...         {"name": "dali_files@12", "fed_images_per_second": {"runs": [8.0, 10.0]}}]
        >>> against_best_dali(rows, ("dali", "dali_files"))
        >>> rows[0]["fed_over_best_dali"]["runs"], "fed_over_best_dali" in rows[1]
        ([1.2, 1.1], False)
        >>> stopped = [{"name": "shardloader", "fed_images_per_second": {"runs": [12.0, 11.0]}},
        ...            {"name": "dali", "fed_images_per_second": {"runs": [10.0]}}]
        >>> against_best_dali(stopped, ("dali",))
        >>> stopped[0]["fed_over_best_dali"]["runs"]
        [1.2]
    """
    refs = [r["fed_images_per_second"]["runs"] for r in results if r["name"].split("@")[0] in dali]
    best = [max(column) for column in zip(*refs, strict=False)]  # the repetitions every DALI row finished
    for r in results:
        pairs = list(zip(r["fed_images_per_second"]["runs"], best, strict=False))
        if r["name"].split("@")[0] not in dali and pairs:
            r["fed_over_best_dali"] = spread([a / b for a, b in pairs])


def with_feeders(label: str, runs: list[TrainRun]) -> str:
    """``label`` with the feeder processes its loaders ran, which ``feeders="auto"`` decides when a
    loader is built (none off the GPU route, none where they cannot start) and once it has timed
    the loop both ways (none where the loop ran faster without them).

    Example:
        >>> from shardkit.bench.train import TrainRun
        >>> with_feeders("ShardLoader", [TrainRun(1.0, 1.0, 0.0, None, feeders=3)])
        'ShardLoader, 3 feeders'
    """
    ran = sorted({r.feeders or 0 for r in runs})
    if ran in ([], [0]):
        return label
    if len(ran) == 1:
        return f"{label}, {counted(ran[0], 'feeder')}"
    return f"{label}, feeders by run {'/'.join(str(r.feeders or 0) for r in runs)}"


def trial_note(result: dict[str, Any], batch_size: int | None = None) -> str | None:
    """What ``feeders="auto"``'s trial timed in each run of one contender (``result``, a report's)
    and which side it kept, or None where no run has a trial; with ``batch_size``, also the time
    per batch the timed run then fed the step at (the pace the side kept delivered).

    Example:
        >>> print(trial_note({"label": "ShardLoader", "runs": [
        ...     {"feeders": 3, "trial_ms": {"feeders": 8.58, "here": 9.34}, "fed_images_per_second": 12800},
        ...     {"feeders": 0, "trial_ms": {"feeders": 8.6, "here": 8.5}, "fed_images_per_second": 10000}]},
        ...     batch_size=128))  # doctest: +NORMALIZE_WHITESPACE
        ShardLoader, feeders='auto' timed a batch fed by its feeders / from the training process:
        run 1 8.58 / 9.34 ms, kept 3 feeders, then fed one every 10.00 ms; run 2 8.60 / 8.50 ms, kept
        none, then fed one every 12.80 ms.
    """
    runs = result.get("runs", [])
    if not any(r.get("trial_ms") for r in runs):
        return None
    parts = []
    for i, r in enumerate(runs, 1):
        paces = r.get("trial_ms") or {}
        timed = " / ".join(f"{paces[side]:.2f}" if side in paces else "—" for side in ("feeders", "here"))
        kept = counted(r["feeders"], "feeder") if r.get("feeders") else "none"
        fed = r.get("fed_images_per_second")
        then = f", then fed one every {1e3 * batch_size / fed:.2f} ms" if batch_size and fed and paces else ""
        parts.append(f"run {i} {timed} ms, kept {kept}{then}")
    return (f"{result['label']}, feeders='auto' timed a batch fed by its feeders / from the training process: "
            + "; ".join(parts) + ".")


def summarise(runs: list[TrainRun]) -> dict[str, Any]:
    """One contender's runs (one at least) as report figures: spreads of the rates, share and host
    wait, the median step and loader GPU times (None off CUDA), and every run.

    Raises:
        ValueError: no run (a contender a stopped bench never ran has no row).
    """
    if not runs:
        raise ValueError("no run to summarise")
    gpu = [r.loader_gpu_ms_per_batch for r in runs if r.loader_gpu_ms_per_batch is not None]
    step_gpu = [r.step_gpu_ms for r in runs if r.step_gpu_ms is not None]
    return {
        "step_gpu_ms": statistics.median(step_gpu) if step_gpu else None,
        "synthetic_images_per_second": spread([r.synthetic_images_per_second for r in runs]),
        "fed_images_per_second": spread([r.fed_images_per_second for r in runs]),
        "share": spread([r.share for r in runs]),
        "host_wait_fraction": spread([r.host_wait_fraction for r in runs]),
        "loader_gpu_ms_per_batch": statistics.median(gpu) if gpu else None,
        "runs": [asdict(r) for r in runs],
    }


def format_train_table(report: dict[str, Any], width: int | None = None) -> str:
    """The report as a text table: median (min–max) of each figure over the repetitions (in
    ``width`` columns, see :func:`train_table`)."""
    cfg = report["config"]
    title = (f"training step: {cfg['model']} @{cfg['size']} px, batch {cfg['batch_size']}, bf16 autocast, "
             f"channels_last, {'torch.compile' if cfg['compile'] else 'eager'}, {counted(cfg['workers'], 'worker')}, "
             f"{counted(cfg['steps'], 'timed step')} x {counted(cfg['repeats'], 'run')} on {cfg['device']}")
    return train_table(title, report["results"], cfg["batch_size"], width, report.get("interrupted"))


#: A run projected to take longer than this is said before it goes on (a CPU step, a large model).
LONG_RUN_S = 60.0


def say_if_long(runs: int, seconds: float, *, early: bool = False) -> bool:
    """Say on stderr, where the bench's first run takes at least ``seconds`` (over
    :data:`LONG_RUN_S`), how long its ``runs`` runs take and what sets that: a bench of a step on
    the CPU ran for hours without a word. ``early``: ``seconds`` is reckoned from the first run's
    fastest warm-up step (said as "about"), before its first timed run. Whether it said it."""
    if seconds <= LONG_RUN_S:
        return False
    least = "about" if early else "at least"
    each = f", each {least} {_duration(seconds)}" if runs > 1 else ""
    print(f"bench: its {runs} run{'s' * (runs > 1)} take {least} {_duration(seconds * runs)}{each} (--steps, "
          "--warmup, --repeats, --model, --size and --batch-size set it)", file=sys.stderr, flush=True)
    return True


def _duration(seconds: float) -> str:
    """``seconds`` as a person says it: ``45 s``, ``12 min``, ``2.5 h``.

    >>> _duration(45), _duration(720), _duration(9000)
    ('45 s', '12 min', '2.5 h')
    """
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
