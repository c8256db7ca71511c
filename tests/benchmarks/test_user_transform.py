"""benchmarks/user_transform.py runs and reports the shardkit it imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import user_transform
from sample_data.generate import make_indexed_imagefolder
from shardkit.pack import PackOptions, pack


def test_it_times_the_checkout_it_is_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    make_indexed_imagefolder(tmp_path / "tree", classes=2, per_class=6, size=(32, 24))
    packed = tmp_path / "packed"
    pack(str(tmp_path / "tree"), str(packed), options=PackOptions(max_count=8), workers=1)
    user_transform.main([str(packed), "--epochs", "1", "--batch-size", "8", "--size", "16", "--root", str(root)])
    out = capsys.readouterr().out
    assert out.startswith(f"{root / 'shardkit' / '__init__.py'}: ") and " img/s (passes: " in out
