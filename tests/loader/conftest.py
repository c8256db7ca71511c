"""Packed datasets for loader tests: tiny ImageFolder trees whose pixels encode their index."""

from __future__ import annotations

from pathlib import Path

import pytest

from sample_data.generate import make_indexed_imagefolder
from shardkit.pack import PackOptions, pack


@pytest.fixture(scope="session")
def indexed_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexed") / "src"
    make_indexed_imagefolder(root, classes=3, per_class=23, size=(64, 48))
    return root


@pytest.fixture(scope="session")
def packed(indexed_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """69 samples in shards of at most 10 (uneven last shard)."""
    dst = tmp_path_factory.mktemp("packed") / "ds"
    pack(str(indexed_tree), str(dst), options=PackOptions(max_count=10, seed=1), workers=1)
    return dst
