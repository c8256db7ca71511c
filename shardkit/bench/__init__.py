"""Side-by-side throughput benchmarks: ShardLoader vs torchvision ImageFolder and webdataset.

Its names are imported on first use (the baselines import torchvision); the CLI imports it lazily.

Example::

    from shardkit.bench import BenchConfig, format_table, run_bench
    report = run_bench(BenchConfig("data/train", workers=2, batch_size=64, repeats=5))
    print(format_table(report))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardkit.bench.api import run_bench
    from shardkit.bench.config import CONTENDERS, BenchConfig, ProgressSink
    from shardkit.bench.harness import (
        Contender,
        RunResult,
        alternating_order,
        run_alternating,
        run_once,
    )
    from shardkit.bench.plot import plot_report
    from shardkit.bench.report import SCHEMA, build_report, format_conditions, format_table, write_json

#: Where each public name lives: imported on first use, so that a process that needs one
#: submodule (each isolated run of ``bench --train`` imports its own) does not pay for the
#: baselines' torchvision (about 2 s of CPU).
_HOME = {
    **dict.fromkeys(("CONTENDERS", "BenchConfig", "ProgressSink"), "config"),
    "run_bench": "api",
    **dict.fromkeys(("Contender", "RunResult", "alternating_order", "run_alternating", "run_once"), "harness"),
    "plot_report": "plot",
    **dict.fromkeys(("SCHEMA", "build_report", "format_conditions", "format_table", "write_json"), "report"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "CONTENDERS",
    "SCHEMA",
    "BenchConfig",
    "Contender",
    "ProgressSink",
    "RunResult",
    "alternating_order",
    "build_report",
    "format_conditions",
    "format_table",
    "plot_report",
    "run_alternating",
    "run_bench",
    "run_once",
    "write_json",
]
