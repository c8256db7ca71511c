"""Running a user's script in a fresh interpreter, as ``python script.py`` from the repository
root (this checkout first on the path): where what a test checks is how a process starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_script_file(path: Path, text: str, *, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """Write ``text`` to ``path`` and run it with this checkout on ``PYTHONPATH``."""
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, env=env)
