"""Tiny ImageFolder trees for the bench tests (generated, seeded; no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sample_data.generate import make_imagenet_like


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 small ImageNet-like images in 2 classes (a few grayscale/PNG among them)."""
    root = tmp_path_factory.mktemp("bench") / "tree"
    make_imagenet_like(root, classes=2, per_class=12, seed=0, size=(80, 60))
    return root
