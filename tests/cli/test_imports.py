"""The CLI and the top-level package start fast: no torch import."""

import subprocess
import sys

import pytest

CHECK = ("import sys, {module}; heavy = [m for m in ('torch', 'torchvision') if m in sys.modules]; "
         "print(heavy)")


@pytest.mark.parametrize("module", ["shardkit", "shardkit.cli", "shardkit.format", "shardkit.index",
                                    "shardkit.pack", "shardkit.storage", "shardkit.sources"])
def test_import_does_not_pull_in_torch(module):
    out = subprocess.run([sys.executable, "-c", CHECK.format(module=module)], capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_help_does_not_import_torch():
    code = ("import sys, runpy; sys.argv = ['shardkit', '--help']\n"
            "try:\n    runpy.run_module('shardkit', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'CLEAN')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    assert "pack" in out.stdout and "verify" in out.stdout and "info" in out.stdout
    assert out.stdout.strip().endswith("CLEAN")
