"""GPU path pieces that need no GPU: what workers ship, the nvJPEG decision, the fallback, and
the device math emulated on the CPU against the CPU path."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import cast

import pytest
import torch

from shardkit import ShardLoader, transforms
from shardkit.codec import jpeg_restart
from shardkit.codec.nvjpeg import gpu_decode_unavailable, nvjpeg_friendly
from shardkit.loader.routes.device.payload import RawImages
from tests.conftest import encode_image
from tests.loader.gpu_helpers import (
    emulate_device,
    make_packed_imagenet_like,
    pixels,
    raw_and_cpu_streams,
    raw_images,
)


@pytest.fixture(scope="module")
def inet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("inet"))


@pytest.mark.parametrize("mode", ["jpeg", "gray", "cmyk", "png", "progressive"])
def test_nvjpeg_decision(mode: str) -> None:
    if mode == "progressive":
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (20, 10), (1, 2, 3)).save(buf, "JPEG", progressive=True)
        data = buf.getvalue()
    else:
        data = {"jpeg": encode_image(mode="RGB"), "gray": encode_image(mode="L"),
                "cmyk": encode_image(mode="CMYK"), "png": encode_image(fmt="PNG")}[mode]
    assert nvjpeg_friendly(data) is (mode == "jpeg")
    assert nvjpeg_friendly(data, gray=True) is (mode in ("jpeg", "gray"))


def test_grayscale_goes_to_the_device_only_sampled_1x1() -> None:
    """A one-component JPEG that declares 2x2 sampling (some encoders write it; the probe never
    decoded one) stays with the workers."""
    data = bytearray(encode_image(mode="L"))
    sof = data.index(b"\xff\xc0")
    assert data[sof + 11] == 0x11
    assert nvjpeg_friendly(bytes(data), gray=True)
    data[sof + 11] = 0x22
    assert not nvjpeg_friendly(bytes(data), gray=True)


def test_gray_probe_accepts_the_cpu_batch_decoder_and_refuses_a_wrong_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_gray: the CPU batch decoder (torchvision's libjpeg, three equal channels) passes; one
    that returns a single channel, unequal channels, or pixels off by 2 levels does not, and no
    decoder at all is a no, not an error."""
    from shardkit.codec import backend

    cpu = torch.device("cpu")
    backend.gpu_gray.cache_clear()
    assert backend.gpu_gray(cpu)
    real = backend.cpu_batch_decoder()

    def spoilt(how: str) -> backend.GpuDecoder:
        def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
            out = real(datas, device)
            gray = out[1]
            out[1] = {"one channel": gray[:1], "unequal": torch.cat([gray[:2], gray[2:].flip(-1)]),
                      "off by 2": (gray.int() + 2).clamp(0, 255).to(torch.uint8)}[how]
            return out
        return decode

    def none() -> backend.GpuDecoder:
        raise RuntimeError("no native JPEG decoder on the CPU")

    try:
        for how in ("one channel", "unequal", "off by 2"):
            monkeypatch.setattr(backend, "cpu_batch_decoder", lambda how=how: spoilt(how))
            backend.gpu_gray.cache_clear()
            assert not backend.gpu_gray(cpu), how
        monkeypatch.setattr(backend, "cpu_batch_decoder", none)  # no decoder at all: False, not an error
        backend.gpu_gray.cache_clear()
        assert not backend.gpu_gray(cpu)
    finally:
        monkeypatch.undo()
        backend.gpu_gray.cache_clear()


def test_gray_jpegs_ship_encoded_and_match_the_cpu_path(inet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``gray``, the workers ship grayscale JPEGs encoded (fewer images decoded in workers),
    and the batches, decoded as the device decodes them, still equal the CPU path's."""
    from shardkit.codec.nvjpeg import GpuJpegDecoder

    monkeypatch.setattr("shardkit.loader.read.samples.roi_available", lambda: False)
    transform = transforms.imagenet_train(64)
    batch_decode = GpuJpegDecoder(torch.device("cpu")).decode  # the device route's batch call, on the CPU
    fallbacks = {}
    for gray in (False, True):
        cpu, raw = raw_and_cpu_streams(inet, transform, gray=gray)
        fallbacks[gray] = 0
        for a, b in zip(cpu, raw, strict=True):
            fallbacks[gray] += b.stats.gpu_fallback
            diff = (emulate_device(b, batch_decode).int() - pixels(a).int()).abs()
            assert diff.max() <= 1, (gray, diff.max())
    assert fallbacks[False] - fallbacks[True] == 1 and fallbacks[True] == 2, fallbacks  # CMYK and PNG stay


@pytest.mark.parametrize("preset", [transforms.imagenet_train, transforms.imagenet_val])
def test_raw_batches_match_the_cpu_path(inet: Path, preset: object, monkeypatch: pytest.MonkeyPatch) -> None:
    # decode on both sides with torchvision's libjpeg (the emulation's decoder; the region
    # decoder uses the system's, another build may round the IDCT otherwise), so only the
    # resize math differs
    monkeypatch.setattr("shardkit.loader.read.samples.roi_available", lambda: False)
    transform = preset(64)  # type: ignore[operator]
    cpu, raw = raw_and_cpu_streams(inet, transform)
    fallback = 0
    for a, b in zip(cpu, raw, strict=True):
        assert isinstance(b.images, RawImages)
        assert a.keys == b.keys and torch.equal(a.labels, b.images.labels)
        fallback += b.stats.gpu_fallback
        assert b.stats.gpu_fallback == len(b.images.cpu_dest)
        got = emulate_device(b)
        diff = (got.int() - pixels(a).int()).abs()
        assert diff.max() <= 1, diff.max()  # float vs fixed-point uint8 rounding only
    assert fallback >= 3  # the CMYK, grayscale and PNG files, decoded by workers


@pytest.mark.skipif(not jpeg_restart.available(), reason="restart-indexed JPEG extension not built")
def test_restart_indexed_jpegs_ship_only_the_crop(tmp_path: Path, inet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardkit.loader.read.samples.roi_available", lambda: False)  # CPU path: full decodes
    transform = transforms.imagenet_train(64)
    restart = make_packed_imagenet_like(tmp_path, restart=True)
    cpu, raw = raw_and_cpu_streams(restart, transform)
    _, plain = raw_and_cpu_streams(inet, transform)
    shipped = {"restart": 0, "plain": 0}
    for a, b, c in zip(cpu, raw, plain, strict=True):
        assert isinstance(b.images, RawImages) and isinstance(c.images, RawImages)
        shipped["restart"] += b.images.nbytes
        shipped["plain"] += c.images.nbytes
        got = emulate_device(b)  # decodes the shipped cut JPEGs, crops by the shifted boxes
        diff = (got.int() - pixels(a).int()).abs()
        assert diff.max() <= 1, diff.max()  # cut pieces decode to the full image's pixels
    assert shipped["restart"] < 0.8 * shipped["plain"], shipped


def test_shipped_boxes_are_the_cpu_paths_draws(inet: Path) -> None:
    transform = transforms.imagenet_train(64)
    _, raw = raw_and_cpu_streams(inet, transform)
    batch = next(iter(raw))
    rows = raw_images(batch).geometry.tolist()
    assert rows, "expected some JPEGs on the GPU path"
    for row in rows:
        h, w, top, left, bh, bw, vh, vw, oy, ox, flip, dest = row
        assert (vh, vw, oy, ox) == (64, 64, 0, 0) and 0 <= dest < 16
        assert transforms.CropFlip(top, left, bh, bw, bool(flip)).inside(h, w)


def test_same_seeded_draws_give_same_boxes() -> None:
    t = transforms.imagenet_train(224)
    a = t.sample_params(380, 500, random.Random(11))
    b = t.sample_params(380, 500, random.Random(11))
    assert a == b


def test_cuda_device_without_cuda_falls_back_with_one_log_line(inet: Path, caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from shardkit.loader.routes import choose as routing

    routing._warned.clear()  # fallbacks are logged once per process
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        loader = ShardLoader(str(inet), batch_size=8, transform=transforms.imagenet_train(32), device="cuda")
        ShardLoader(str(inet), batch_size=8, transform=transforms.imagenet_train(32), device="cuda")
    assert loader.device.type == "cpu"
    assert sum("GPU decoding unavailable" in r.getMessage() for r in caplog.records) == 1
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.uint8
    assert gpu_decode_unavailable(torch.device("cpu")) is not None


@pytest.mark.parametrize("transform", [None, "callable"])
def test_cuda_device_without_cuda_falls_back_whatever_the_transform(inet: Path, caplog: pytest.LogCaptureFixture,
                                                                     transform: str | None) -> None:
    # with no ImageTransform the route only copies batches to the device: it failed there, at the
    # first batch, with torch's "Found no NVIDIA driver" traceback
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from shardkit.loader.routes import choose as routing

    routing._warned.clear()
    given = (lambda image: image[:, :8, :8]) if transform else None
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        loader = ShardLoader(str(inet), batch_size=4, transform=given, device="cuda")
    assert loader.device.type == "cpu"
    assert [r.getMessage() for r in caplog.records if "CUDA is not available here" in r.getMessage()] == [
        "shardkit: device='cuda', but CUDA is not available here (torch.cuda.is_available() is False); batches on "
        "cpu (`shardkit doctor` checks CUDA)"]
    images, _labels = next(iter(loader))
    assert all(image.device.type == "cpu" for image in images)
    loader.close()


def test_worker_buffer_cycle_gives_the_same_bytes(inet: Path) -> None:
    """Workers reuse shared-memory buffers; batches taken and copied in order are unchanged."""
    from torch.utils.data import DataLoader

    from shardkit.loader.routes.gpu.worker import RawBatchBuilder
    from shardkit.loader.run.stream import BatchStream

    t = transforms.imagenet_train(32)
    _, plain = raw_and_cpu_streams(inet, t, batch_size=4)
    want = [(b.keys, raw_images(b).data.clone()) for b in plain]
    stream = plain.stream
    reader = cast(RawBatchBuilder, stream.builder).samples.reader
    cycled = BatchStream(stream.config, RawBatchBuilder(reader, t, buffer_cycle=3), stream.control)
    dl = DataLoader(cycled, batch_size=None, num_workers=2, prefetch_factor=1, persistent_workers=True)
    keep, got = [], []
    for b in dl:
        keep.append(b)  # keeps the mappings alive, as the prefetcher does
        got.append((b.keys, b.images.data.clone()))  # the copy the prefetcher's staging makes
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))
    storages = {b.images.data.untyped_storage().data_ptr() for b in keep}
    assert len(got) > 12 and len(storages) <= 2 * 3  # two workers, three buffers each
