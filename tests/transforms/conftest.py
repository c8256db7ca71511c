"""Fixtures for the transform tests."""

from __future__ import annotations

import pytest
import torch

from tests.transforms.images import make_photo


@pytest.fixture
def photo() -> torch.Tensor:
    return make_photo(187, 251)
