"""Run a script under Triton's interpreter (``TRITON_INTERPRET=1``, on the CPU), in a process of
its own: the variable is read when Triton is imported. Shared by the tests of both resize kernels.

Triton's interpreter before 3.8 turns a loop bound computed in the kernel (the filter's tap count,
``range(0, taps_y)`` in :mod:`shardkit.transforms.gpu_filter`) into a one-element array that
NumPy 2 refuses to make an ``int`` of (``TypeError: only 0-dimensional arrays can be converted to
Python scalars``; seen with Triton 3.6 and NumPy 2.4 and 2.5). That is the interpreter's limit, not
the kernel's: the compiled kernel is tested against the eager path on CUDA. There the test skips,
saying so; any other failure fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What the interpreter's refusal says (see the module doc).
INTERPRETER_LIMIT = "only 0-dimensional arrays can be converted to Python scalars"


def run_interpreted(script: str) -> str:
    """``script``'s standard output, run under the Triton interpreter with the repository importable."""
    triton = pytest.importorskip("triton")
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    old = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8)
    if res.returncode != 0 and old and INTERPRETER_LIMIT in res.stderr:
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot take the kernel's computed loop bound "
                    "with this NumPy (Triton 3.8 takes it); the compiled kernel is tested on CUDA")
    assert res.returncode == 0, f"the kernel failed under the Triton interpreter: {res.stderr[-2000:]}"
    return res.stdout
