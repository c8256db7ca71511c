"""The CLI tests' shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from sample_data.generate import make_imagenet_like


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("benchcli") / "tree"
    make_imagenet_like(root, classes=2, per_class=12, seed=0, size=(80, 60))
    return root
