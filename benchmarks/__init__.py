"""shardkit's benchmarks, reliability experiments and labelled experiments; run each as a module
from the repository root (``python -m benchmarks.bench_pack --help``). See ``benchmarks/README.md``."""
