"""The per-sample CRC-32: zlib's values whichever library computes them."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from shardkit.doctor.extensions import check_crc
from shardkit.format import crc
from tests.cli.terminal import ROOT


@pytest.mark.parametrize("size", [0, 1, 15, 16, 63, 64, 4095, 54_321, 1 << 20])
def test_same_values_as_zlib(size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)  # continued, as tarwrite does
    view = memoryview(data)[size // 3:]
    assert crc.crc32(view) == zlib.crc32(view)


def test_the_environment_has_the_fast_one_and_doctor_says_so() -> None:
    assert crc.FAST, "zlib-ng is a dependency: this environment lacks it"
    assert check_crc().status == "ok"


def test_without_zlib_ng_zlibs_is_used_and_doctor_names_the_fix() -> None:
    script = ("import sys; sys.modules['zlib_ng'] = None\n"  # as if not installed
              "import zlib\n"
              "from shardkit.format import crc\n"
              "from shardkit.doctor.extensions import check_crc\n"
              "finding = check_crc()\n"
              "print(crc.FAST, crc.crc32 is zlib.crc32, finding.status, finding.fix)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}).stdout
    assert out.startswith("False True problem pip install zlib-ng"), out
