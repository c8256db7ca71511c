"""A loader that falls back to a slower path says so once per process, naming the fix."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardkit import ShardLoader, transforms
from shardkit.loader.routes import choose as routing


def test_no_region_decoder_is_logged_once_with_its_fix(packed: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(routing, "roi_available", lambda: False)
    monkeypatch.setattr(routing, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        for _ in range(3):
            ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_train(32)).close()
        ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_val(32)).close()  # resizes first
    lines = [r.getMessage() for r in caplog.records if "region decoder" in r.getMessage()]
    assert len(lines) == 1
    assert "libjpeg62-turbo-dev" in lines[0] and "shardkit doctor" in lines[0]


def test_with_the_region_decoder_nothing_is_logged(packed: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(routing, "roi_available", lambda: True)
    monkeypatch.setattr(routing, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_train(32)).close()
    assert not [r for r in caplog.records if "region decoder" in r.getMessage()]
