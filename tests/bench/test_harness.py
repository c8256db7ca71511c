"""The harness on fake loaders: warm-up excluded, alternating order, process-tree sampling."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from shardkit.bench import Contender, alternating_order, run_alternating, run_once
from shardkit.bench.proctree import TreeSampler, descendants, tree_snapshot, wait_for_exit


class _FakeLoader:
    """Each iteration: ``batches`` batches of ``size`` images, like a loader's epoch."""

    def __init__(self, batches: int, size: int) -> None:
        self.batches, self.size = batches, size

    def __iter__(self):
        for _ in range(self.batches):
            yield (torch.zeros(self.size, 3, 4, 4, dtype=torch.uint8),
                   torch.zeros(self.size, dtype=torch.int64))


def test_run_once_counts_only_timed_batches() -> None:
    seen: list[int] = []
    c = Contender("fake", "fake loader", lambda: _FakeLoader(5, 8))
    result = run_once(c, epochs=2, warmup=3, progress=lambda _n, k: seen.append(k))
    assert sum(seen) == 10
    assert result.images == (10 - 3) * 8  # the 3rd batch ends the warm-up
    assert result.batch_shape == (8, 3, 4, 4)
    assert result.first_batch_s >= 0 and result.seconds > 0 and result.images_per_second > 0


def test_run_once_rejects_warmup_covering_everything() -> None:
    with pytest.raises(ValueError, match="none to time"):
        run_once(Contender("fake", "fake", lambda: _FakeLoader(2, 1)), epochs=1, warmup=2)


def test_alternating_order_and_run_order() -> None:
    assert alternating_order(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    order: list[str] = []
    contenders = [Contender(n, n, lambda: _FakeLoader(3, 2), baseline=n == "a")
                  for n in ("a", "b", "c")]
    runs = run_alternating(contenders, repeats=2, epochs=1, warmup=1,
                           before_run=lambda c: order.append(c.name))
    assert order == ["a", "b", "c", "c", "b", "a"]
    assert {k: len(v) for k, v in runs.items()} == {"a": 2, "b": 2, "c": 2}


def test_tree_sampler_counts_child_cpu() -> None:
    sampler = TreeSampler(interval=0.05).start()
    # The child burns 0.4 s of CPU (however long that takes on a busy machine), then idles so
    # that a sample sees its final CPU time before it exits.
    code = "import time\nwhile time.process_time() < 0.4: pass\ntime.sleep(1.5)"
    child = subprocess.Popen([sys.executable, "-c", code])
    assert child.pid in descendants()
    assert os.getpid() in tree_snapshot()
    child.wait()
    usage = sampler.stop()
    # the child's CPU time is counted, though it never exited while sampled
    assert usage.cpu_seconds > 0.3
    assert usage.peak_rss_bytes > 0 and usage.wall_seconds > 0.5
    assert wait_for_exit({child.pid}, timeout=1.0)
