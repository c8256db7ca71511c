"""The device prefetcher's thread plumbing without a GPU (CUDA faked out): the reorder buffer,
order and slot ownership with one or several decode threads, errors reaching the consumer, and
close stopping the threads."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from shardkit.loader.routes.device import prefetch
from shardkit.loader.routes.device.prefetch import InOrder
from shardkit.loader.stats import StageStats


def test_in_order_returns_items_in_sequence() -> None:
    r = InOrder()
    assert r.push(2, "c") == [] and r.push(1, "b") == [] and len(r) == 2
    assert r.push(0, "a") == ["a", "b", "c"] and len(r) == 0
    assert r.push(3, "d") == ["d"]
    with pytest.raises(ValueError):
        r.push(1, "again")


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
    """A decoder that takes random time and notes which thread decoded; augment checks slot ownership."""

    def __init__(self) -> None:
        self.rng, self.lock = random.Random(0), threading.Lock()
        self.decoded, self.threads = 0, set[int]()

    def decode_many(self, items: list[tuple[object, _FakeSlot]]) -> list[tuple[list[str], list[int]]]:
        with self.lock:
            t = self.rng.random() * 0.004
            self.decoded += len(items)
            self.threads.add(threading.get_ident())
        time.sleep(t)
        return [(["decoded"], []) for _ in items]

    def augment(self, batch: object, slot: _FakeSlot, decoded: list[str], rejected: list[int]) -> object:
        assert slot.batch is batch
        return batch


@pytest.fixture(autouse=True)
def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("Stream", _FakeStream), ("Event", _FakeEvent),
                        ("device", lambda d: contextlib.nullcontext()),
                        ("stream", lambda s: contextlib.nullcontext()),
                        ("current_stream", lambda d=None: _FakeStream())):
        monkeypatch.setattr(torch.cuda, name, value)


def _prefetcher(pipe: object, n: int, decode_threads: int = 1) -> prefetch.DevicePrefetcher[Any, Any]:
    batches = [SimpleNamespace(seq=i, images=None, labels=None, tensors=tuple) for i in range(n)]
    return prefetch.DevicePrefetcher(iter(batches), pipe, torch.device("cpu"),  # type: ignore[arg-type]
                                     [_FakeSlot() for _ in range(prefetch.staging_slots(2))],  # type: ignore[misc]
                                     StageStats(), depth=2, decode_threads=decode_threads)


@pytest.mark.parametrize("decode_threads", [1, 3])
def test_prefetcher_threads_keep_order_and_slots(decode_threads: int) -> None:
    """Every batch arrives once, in order, and no slot is restaged while its batch is in flight,
    with one decode thread or several finishing out of order."""
    pipe = _FakePipeline()
    got = [b.seq for b in _prefetcher(pipe, 300, decode_threads)]
    assert got == list(range(300))
    assert pipe.decoded == 300
    assert (len(pipe.threads) > 1) is (decode_threads > 1)


def test_prefetcher_decode_errors_reach_the_consumer_and_close_stops_threads() -> None:
    class Failing(_FakePipeline):
        def decode_many(self, items: list[tuple[object, _FakeSlot]]) -> list[tuple[list[str], list[int]]]:
            raise ValueError("decode broke")

    with pytest.raises(ValueError, match="decode broke"):
        for _ in _prefetcher(Failing(), 300, decode_threads=2):
            pass
    p = _prefetcher(_FakePipeline(), 300, decode_threads=2)
    it = iter(p)
    assert [next(it).seq for _ in range(10)] == list(range(10))
    it.close()  # type: ignore[attr-defined]  # a generator
    assert not any(t.is_alive() for t in p._threads)
