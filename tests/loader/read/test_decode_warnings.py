"""A dataset holding JPEGs that libjpeg warns about (corrupt but decodable) loads with workers
without libjpeg's raw "Corrupt JPEG data" lines on stderr: each is counted in
``stats.decode_warnings`` and the first of each process is logged once, naming the sample.

The load runs as its own process, so that its stderr (fd 2, which libjpeg writes to from the
worker processes) is what a user sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sample_data.generate import make_indexed_imagefolder
from shardkit.codec import libjpeg
from shardkit.pack import PackOptions, pack
from tests.cli.terminal import ROOT

pytestmark = pytest.mark.skipif(not libjpeg.available(), reason="shardkit's C extension is not built")

_LOAD = """
import sys
from shardkit import ShardLoader, transforms

for transform in (transforms.imagenet_val(32), transforms.imagenet_train(32)):
    with ShardLoader(sys.argv[1], batch_size=4, transform=transform, num_workers=2, shuffle=False) as loader:
        batches = sum(1 for _ in loader)
        print(batches == len(loader), loader.stats.decode_warnings, loader.stats.replaced)
"""


def _with_stray_bytes(path: Path) -> None:
    """Three bytes before the scan: libjpeg decodes the image and warns."""
    data = path.read_bytes()
    scan = data.index(b"\xff\xda")
    path.write_bytes(data[:scan] + b"\x00\x01\x02" + data[scan:])


@pytest.mark.timeout(240)
def test_loader_workers_print_no_raw_libjpeg_warnings(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_indexed_imagefolder(src, classes=2, per_class=6, size=(64, 48))
    damaged = sorted(src.rglob("*.jpg"))[::5]  # 3 of 12
    for path in damaged:
        _with_stray_bytes(path)
    result = pack(str(src), str(tmp_path / "ds"), options=PackOptions(max_count=4), workers=1)
    assert result.manifest.num_samples == 12  # decodable, so packed (the acceptance rule)
    done = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path / "ds")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=200)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert not any(line.startswith("Corrupt JPEG data") for line in lines), done.stderr
    assert done.stdout.split("\n")[:2] == ["True 3 0", "True 3 0"], done.stdout  # 3 warnings counted per epoch
    logged = [line for line in lines if ": libjpeg: Corrupt JPEG data: 3 extraneous bytes" in line]
    assert 1 <= len(logged) <= 4 and len(logged) == len(lines), done.stderr  # at most once per worker
    assert all(".tar:" in line for line in logged), done.stderr  # names the shard and key
