"""The optional hardware JPEG decoder's plumbing, without a GPU: the probe's refusals, the
prefetcher's reorder buffer, and how :meth:`GpuPipeline.decode_hw` joins the images the
hardware decoded with those nvJPEG (here: torchvision on the CPU) decoded instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardkit import transforms
from shardkit.codec.nvimgcodec import hw_decode_unavailable
from shardkit.loader.gpu.pinned import PinnedSlot
from shardkit.loader.gpu.pipeline import GpuPipeline
from shardkit.loader.gpu.prefetch import InOrder
from shardkit.transforms.gpu import GEOMETRY_COLUMNS
from tests.loader.gpu_helpers import make_packed_imagenet_like, raw_and_cpu_streams


@pytest.fixture(scope="module")
def inet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("inet_hw"))


def test_probe_refuses_without_cuda() -> None:
    hw_decode_unavailable.cache_clear()
    reason, planar = hw_decode_unavailable(torch.device("cpu"))
    assert reason is not None and planar is False
    hw_decode_unavailable.cache_clear()


def test_hw_decode_is_a_parameter_off_by_default_and_validated(packed: Path) -> None:
    from shardkit import LoaderError, ShardLoader
    from shardkit.loader import GpuOptions

    source = (Path(__file__).parents[2] / "shardkit" / "codec" / "nvimgcodec.py").read_text()
    assert "environ" not in source  # no ambient configuration (STYLE principle 6)
    with pytest.raises(LoaderError, match="hw_decode"):
        ShardLoader(str(packed), batch_size=4, gpu=GpuOptions(hw_decode="yes"))  # type: ignore[arg-type]
    with pytest.raises(LoaderError, match="hw_decode_threads"):
        ShardLoader(str(packed), batch_size=4, gpu=GpuOptions(hw_decode_threads=0))
    assert GpuOptions().hw_decode == "off" and ShardLoader.__init__.__kwdefaults__["gpu"] is None  # type: ignore[index]


def test_in_order_returns_items_in_sequence() -> None:
    r = InOrder()
    assert r.push(2, "c") == [] and r.push(1, "b") == [] and len(r) == 2
    assert r.push(0, "a") == ["a", "b", "c"] and len(r) == 0
    assert r.push(3, "d") == ["d"]
    with pytest.raises(ValueError):
        r.push(1, "again")


class _HalfBlind:
    """Stands in for HwJpegDecoder: 'decodes' with torchvision on the CPU, but returns None at
    every third position (as the engines do for images they cannot take)."""

    def __init__(self) -> None:
        self.calls = 0

    def decode(self, datas: list[torch.Tensor], stream: object) -> list[torch.Tensor | None]:
        from torchvision.io import decode_jpeg

        self.calls += 1
        return [None if i % 3 == 1 else decode_jpeg(d) for i, d in enumerate(datas)]


def test_decode_hw_joins_hardware_and_nvjpeg_images_in_order(inet: Path) -> None:
    t = transforms.imagenet_train(224)
    _, raw = raw_and_cpu_streams(inet, t)
    pipe = GpuPipeline(t, torch.device("cpu"), compile=False)
    batches = list(raw)[:2]
    slots = [PinnedSlot(16, (224, 224), len(GEOMETRY_COLUMNS), pin=False) for _ in batches]
    for b, s in zip(batches, slots, strict=True):
        s.stage(b)
    items = list(zip(batches, slots, strict=True))
    hw = _HalfBlind()
    got = pipe.decode_hw(items, hw, stream=None)  # type: ignore[arg-type]
    want = [pipe.decode(b, s) for b, s in items]
    assert hw.calls == 1 and len(got) == len(want)
    for (images, rejected), (ref, ref_rejected) in zip(got, want, strict=True):
        assert rejected == ref_rejected
        assert len(images) == len(ref) > 0
        assert all(torch.equal(a, b) for a, b in zip(images, ref, strict=True))
    total = sum(len(r) for r, _ in want)
    assert sum(b.stats.gpu_hw_images for b in batches) == total - len(range(1, total, 3))


def test_decode_hw_falls_back_when_the_library_fails(inet: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def decode(self, datas: list[torch.Tensor], stream: object) -> list[torch.Tensor | None]:
            raise RuntimeError("engine gone")

    t = transforms.imagenet_train(224)
    _, raw = raw_and_cpu_streams(inet, t)
    pipe = GpuPipeline(t, torch.device("cpu"), compile=False)
    batch = next(iter(raw))
    slot = PinnedSlot(16, (224, 224), len(GEOMETRY_COLUMNS), pin=False)
    slot.stage(batch)
    [(images, rejected)] = pipe.decode_hw([(batch, slot)], Broken(), stream=None)  # type: ignore[arg-type]
    ref, _ = pipe.decode(batch, slot)
    assert not rejected and all(torch.equal(a, b) for a, b in zip(images, ref, strict=True))
    assert "hardware JPEG decode failed" in caplog.text


class _FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: object) -> float:
        return 0.0


class _FakeStream:
    cuda_stream = 0

    def __init__(self, device: object = None) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass


class _FakeSlot:
    def __init__(self) -> None:
        self.event: _FakeEvent | None = None
        self.batch: object = None

    def stage(self, batch: object) -> None:
        assert self.batch is None, "slot restaged before its batch went through augment"
        self.batch = batch

    def release(self, stream: object) -> None:
        self.batch, self.event = None, _FakeEvent()


class _FakePipeline:
    """Decoders that take random time and tag what they decoded; augment checks slot ownership."""

    def __init__(self) -> None:
        import random
        import threading

        self.rng, self.lock, self.by = random.Random(0), threading.Lock(), {"nv": 0, "hw": 0}

    def _sleep(self) -> None:
        import time

        with self.lock:
            t = self.rng.random() * 0.004
        time.sleep(t)

    def decode_many(self, items: list[tuple[object, _FakeSlot]]) -> list[tuple[list[str], list[int]]]:
        self._sleep()
        self.by["nv"] += len(items)
        return [(["nv"], []) for _ in items]

    def decode_hw(self, items: list[tuple[object, _FakeSlot]], hw: object, stream: object
                  ) -> list[tuple[list[str], list[int]]]:
        self._sleep()
        self.by["hw"] += len(items)
        return [(["hw"], []) for _ in items]

    def augment(self, batch: object, slot: _FakeSlot, decoded: list[str], rejected: list[int]) -> object:
        assert slot.batch is batch
        return batch


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from shardkit.loader.gpu import prefetch

    for name, value in (("Stream", _FakeStream), ("Event", _FakeEvent),
                        ("device", lambda d: contextlib.nullcontext()),
                        ("stream", lambda s: contextlib.nullcontext()),
                        ("current_stream", lambda d=None: _FakeStream())):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(prefetch, "HwJpegDecoder", lambda device, planar, threads: object())


def _prefetcher(pipe: object, n: int, hw_planar: bool | None, hw_only: bool = False) -> object:
    from types import SimpleNamespace

    from shardkit.loader.gpu import prefetch
    from shardkit.loader.stats import StageStats

    batches = [SimpleNamespace(seq=i, images=None, labels=None, tensors=tuple) for i in range(n)]
    return prefetch.DevicePrefetcher(iter(batches), pipe, torch.device("cpu"),  # type: ignore[arg-type]
                                     [_FakeSlot() for _ in range(prefetch.staging_slots(2))],  # type: ignore[misc]
                                     StageStats(), depth=2, hw_planar=hw_planar, hw_only=hw_only)


@pytest.mark.parametrize(("hw_planar", "hw_only"), [(None, False), (True, False), (True, True)])
def test_prefetcher_threads_keep_order_and_slots_with_two_decoders(monkeypatch: pytest.MonkeyPatch,
                                                                   hw_planar: bool | None, hw_only: bool) -> None:
    """The prefetcher's thread plumbing with CUDA faked out: every batch arrives once, in order,
    and no slot is restaged while its batch is in flight, with nvJPEG, both decoders, or HW alone."""
    _fake_cuda(monkeypatch)
    pipe = _FakePipeline()
    got = [b.seq for b in _prefetcher(pipe, 300, hw_planar, hw_only)]  # type: ignore[attr-defined]
    assert got == list(range(300))
    assert (pipe.by["nv"] > 0) is not hw_only and (pipe.by["hw"] > 0) is (hw_planar is not None)
    assert pipe.by["nv"] + pipe.by["hw"] == 300


def test_prefetcher_hw_thread_errors_reach_the_consumer_and_close_stops_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch)

    class Failing(_FakePipeline):
        def decode_hw(self, items: list[tuple[object, _FakeSlot]], hw: object, stream: object
                      ) -> list[tuple[list[str], list[int]]]:
            raise ValueError("hw broke")

    with pytest.raises(ValueError, match="hw broke"):
        for _ in _prefetcher(Failing(), 300, True):  # type: ignore[attr-defined]
            pass
    p = _prefetcher(_FakePipeline(), 300, True)
    it = iter(p)  # type: ignore[call-overload]
    assert [next(it).seq for _ in range(10)] == list(range(10))
    it.close()
    assert not any(t.is_alive() for t in p._threads)  # type: ignore[attr-defined]
