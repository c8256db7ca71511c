"""Small packed sets for the framework tests (Lightning, accelerate) and a runner for their scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sample_data.generate import make_indexed_imagefolder
from shardkit.pack import PackOptions, pack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def frames(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train: 48 samples (2 classes of 24: 6 batches of 4 per rank at 2 ranks); val: 42 (2 of 21:
    6 batches of 4 per rank at 2 ranks, of which 6 samples padding in rank 1's last two)."""
    root = tmp_path_factory.mktemp("frameworks")
    out = {}
    for name, per_class in (("train", 24), ("val", 21)):
        make_indexed_imagefolder(root / f"{name}-src", classes=2, per_class=per_class, size=(40, 32))
        pack(str(root / f"{name}-src"), str(root / name), options=PackOptions(max_count=8, seed=1), workers=1)
        out[name] = root / name
    return out


def run_script(*cmd: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """Run ``python cmd...`` from the repository root with this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
