"""Side-by-side throughput benchmarks: ShardLoader vs torchvision ImageFolder and webdataset.

Imports torch (through the baselines and the loader); the CLI imports this package lazily.

Example::

    from shardkit.bench import BenchConfig, format_table, run_bench
    report = run_bench(BenchConfig("data/train", workers=2, batch_size=64, repeats=5))
    print(format_table(report))
"""

from shardkit.bench.api import CONTENDERS, BenchConfig, ProgressSink, run_bench
from shardkit.bench.harness import (
    Contender,
    RunResult,
    alternating_order,
    run_alternating,
    run_once,
)
from shardkit.bench.plot import plot_report
from shardkit.bench.report import SCHEMA, build_report, format_conditions, format_table, write_json

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
