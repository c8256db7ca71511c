"""``shardkit doctor``: check the environment for training with shardkit; exit 1 on problems."""

from __future__ import annotations

import json
import sys

import click

from shardkit.cli.report import fit
from shardkit.cli.workers import WORKERS
from shardkit.doctor import LoaderPlan, diagnose
from shardkit.machine import auto_workers

_MARK = {"ok": ("ok", "green"), "note": ("note", "yellow"), "problem": ("PROBLEM", "red")}


@click.command("doctor")
@click.option("--workers", type=WORKERS, default=None,
              help="Loader workers you plan to use [default: what num_workers='auto' picks: this "
                   "process's share of the usable cores - 1, 1 to 32].")
@click.option("--batch-size", default=256, show_default=True, type=click.IntRange(min=1),
              help="Images per batch you plan to use.")
@click.option("--size", default=224, show_default=True, type=click.IntRange(min=1),
              help="Output side in pixels.")
@click.option("--prefetch", default=2, show_default=True, type=click.IntRange(min=1),
              help="Batches each worker prepares ahead (ShardLoader's prefetch).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor_command(workers: int | None, batch_size: int, size: int, prefetch: int,
                   as_json: bool) -> None:
    """Check Python, torch, CUDA, GPUs, nvJPEG, Triton, the C extensions and their libjpeg,
    shared memory, open-file limits and cores for a loader of --workers/--batch-size/--size, and
    storage backends. Every problem comes with its fix.

    Exits 1 when something breaks or slows training; notes (e.g. no GPU, a storage backend
    not installed) do not change the exit code.
    """
    if workers is None:
        workers = auto_workers()
    plan = LoaderPlan(workers=workers, batch_size=batch_size, size=size, prefetch=prefetch)
    findings = diagnose(plan)
    problems = [f for f in findings if f.status == "problem"]
    if as_json:
        click.echo(json.dumps({"plan": vars(plan), "findings": [f.to_dict() for f in findings]},
                              indent=1))
    else:
        click.echo(f"shardkit doctor: checking for --workers {plan.workers} --batch-size "
                   f"{plan.batch_size} --size {plan.size} (prefetch {plan.prefetch})\n")
        width = max(len(f.check) for f in findings)
        for f in findings:
            mark, colour = _MARK[f.status]
            indent = 8 + 1 + width + 2
            line = fit(f"{mark:<8} {f.check:<{width}}  {f.detail}", indent)
            click.echo(click.style(line[:8], fg=colour) + line[8:])
            if f.fix and f.status != "ok":
                click.echo(fit(f"{'':<8} {'':<{width}}  fix: {f.fix}", indent + 5))
        click.echo("")
        if problems:
            click.echo(f"{len(problems)} problem(s) that break or slow training: "
                       + ", ".join(f.check for f in problems))
        else:
            click.echo("no problems found")
    if problems:
        sys.exit(1)
