from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.pack import PackOptions, pack

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "imagefolder"


@pytest.fixture(scope="session")
def packed_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("sample") / "ds"
    pack(str(SAMPLE), str(dst), options=PackOptions(max_count=64), workers=1)
    return dst
