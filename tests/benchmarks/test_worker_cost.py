"""``benchmarks.worker_cost`` runs end to end on a small pack, every option at once: each step it
stands in for must still be the worker's (a stand-in the worker no longer calls would time nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.loader.gpu_helpers import make_packed_imagenet_like


def test_worker_cost_runs_every_option(tmp_path: Path) -> None:
    ds = make_packed_imagenet_like(tmp_path, per_class=24)
    done = subprocess.run([sys.executable, "-m", "benchmarks.worker_cost", str(ds), "--size", "32", "--batch-size",
                           "8", "--rounds", "2", "--gray", "off,on", "--by-kind", "--ablate", "--stage"],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    passes = [r for r in rows if "gray_shipped_encoded" in r]
    steps = {r["nvjpeg_step_replaced"]: r for r in rows if "nvjpeg_step_replaced" in r}
    stage = [r for r in rows if "stage" in r]
    assert len(passes) == 2 and all(r["cpu_ms_per_image_median"] > 0 for r in passes)
    assert {r["kind"] for r in rows if "kind" in r} >= {"nvjpeg", "png", "jpeg-cmyk"}
    assert set(steps) == {"none", "read", "draw", "frame"}
    assert all(steps[step]["stand_in_calls"] > 0 for step in ("read", "draw", "frame"))  # each stood in for
    assert len(stage) == 1 and stage[0]["bytes_per_image"] > 0 and stage[0]["cpu_ms_per_image_median"] > 0
