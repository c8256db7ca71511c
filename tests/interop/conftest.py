"""Small packed sets for the framework tests (Lightning, accelerate) and a runner for their scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trees import packed_train_val

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def frames(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train: 48 samples (2 classes of 24: 6 batches of 4 per rank at 2 ranks); val: 42 (2 of 21:
    6 batches of 4 per rank at 2 ranks, of which 6 samples padding in rank 1's last two)."""
    root = tmp_path_factory.mktemp("frameworks")
    return packed_train_val(root)


def run_script(*cmd: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """Run ``python cmd...`` from the repository root with this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
