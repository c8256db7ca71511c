"""A test that kills its pytest-xdist worker costs one failure: the run goes on and ends (the suite's
scheduler, tests/scheduling.py). pytest-xdist 3.8's own waited for ever at the end of such a run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_a_worker_killed_by_its_test_costs_that_test_and_the_run_ends(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d"):
        (tmp_path / f"test_{name}.py").write_text("".join(f"def test_{name}{i}():\n    pass\n" for i in range(3)))
    (tmp_path / "test_crash.py").write_text(
        "import os\n"
        "def test_before():\n    pass\n"
        "def test_dies():\n    os._exit(1)\n"
        "def test_after():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.scheduling", "-n", "2",
            "--dist", "loadfile", "-o", "addopts=", "-o", "timeout=0", "--rootdir", str(tmp_path), str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert re.search(r"(?<!\d)1 failed, 14 passed", out), out
    assert "crashed while running 'test_crash.py::test_dies'" in out, out
