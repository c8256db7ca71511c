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


@pytest.mark.parametrize("kind", ["imagefolder", "captions"])
def test_a_cuda_device_the_gpu_route_cannot_serve_gets_the_cpu_route_there(
        packed: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """CUDA present but nvJPEG missing, or a bicubic resize: the CPU route, delivering on the CUDA
    device (labelled and captioned datasets alike), never the GPU route."""
    import torch

    from shardkit.index.manifest_io import read_manifest
    from shardkit.loader.read.reader import ShardReader
    from shardkit.loader.routes.cpu import CpuRoute
    from shardkit.loader.routes.spec import RouteSpec
    from shardkit.storage import Store

    manifest = read_manifest(Store(str(packed)))
    if kind == "captions":  # the same shards read as captioned: routing looks at the kind only
        from dataclasses import replace

        manifest = replace(manifest, kind="captions", classes=None)
    reader = ShardReader(Store(str(packed)), manifest.shards)
    monkeypatch.setattr(routing, "_warned", set())
    monkeypatch.setattr(routing.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(routing, "gpu_decode_unavailable", lambda _device: "nvJPEG is missing")
    cuda = torch.device("cuda")
    for transform in (transforms.imagenet_train(32), transforms.imagenet_train(32, interpolation="bicubic")):
        route = routing.choose_route(manifest, reader, RouteSpec(transform, cuda, 4))
        assert isinstance(route, CpuRoute) and route.device == cuda
        assert (route.builder.captions is not None) is (kind == "captions")
