"""``shardkit bench --train``'s measurement: which batches the synthetic and fed runs take, how
their rates are taken, the step itself and its device times (on the CPU; no timing assertions
beyond a loader's own pace)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from shardkit.bench import step_timing, train, train_report
from shardkit.bench.train import TrainStep, measure


class _Recording:
    """A step that records which batch (its first value) each call took, and costs nothing."""

    device = torch.device("cpu")  # no device times measured (CUDA only)

    def __init__(self) -> None:
        self.taken: list[int] = []

    def to_device(self, batch: Any) -> tuple[Any, Any]:
        return batch[0], batch[1]

    def clone(self, batch: tuple[Any, Any]) -> tuple[Any, Any]:
        return batch[0].clone(), batch[1]

    def __call__(self, images: torch.Tensor, labels: Any, /) -> None:
        self.taken.append(int(images[0]))

    def sync(self) -> None:
        pass


class _Clock:
    """A stand-in for the ``time`` module whose clock is a counter the fake steps advance (a busy
    machine cannot move it); ``sleep`` advances it too."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_synthetic_runs_cycle_over_the_first_fixed_batches() -> None:
    """fixed_batches=3: each synthetic run takes clones of batches 0, 1, 2, 0, 1, …; the fed run
    goes on from 3: a lead-in of warmup + steps, then the timed steps."""
    step = _Recording()
    loader = [(torch.tensor([i]), None) for i in range(20)]  # one epoch of 20 batches
    measure(step, loader, steps=4, warmup=1, batch_size=1, fixed_batches=3, settle_s=0)
    assert step.taken == [0, 1, 2, 0, 1] + list(range(3, 3 + (1 + 4) + 4)) + [0, 1, 2, 0, 1]


def test_the_synthetic_rate_is_taken_over_both_synthetic_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step taking 2 ms a call in the first synthetic run and 20 ms in the second: the rate is
    their images over their seconds (20 / 0.22 s, about 91/s), neither run's alone (500/s or
    50/s). The bench's clock is a counter the step advances, so a busy machine cannot move it."""
    fixed_calls = 0
    clock = _Clock()

    class Slowing(_Recording):
        def __call__(self, images: torch.Tensor, labels: Any, /) -> None:
            nonlocal fixed_calls
            if int(images[0]) == 0:  # the fixed batch: a synthetic step
                fixed_calls += 1
                clock.now += 0.002 if fixed_calls <= 10 else 0.020
            else:  # a fed step
                clock.now += 0.001

    monkeypatch.setattr(train, "time", clock)  # its settling pause
    monkeypatch.setattr(step_timing, "time", clock)  # the steps' clock
    loader = [(torch.tensor([i]), None) for i in range(40)]
    run = measure(Slowing(), loader, steps=10, warmup=0, batch_size=1, settle_s=0)
    assert fixed_calls == 20
    assert run.synthetic_images_per_second == pytest.approx(20 / 0.22)


def test_the_fed_run_is_timed_after_the_read_ahead_is_used_up() -> None:
    """A loader whose thread keeps 12 batches ready (a full ring) and makes one every 10 ms: the
    pause before the synthetic run fills its queue, and the fed run's lead-in uses it up, so the
    timed rate is the loader's (about 100/s), not inflated by 12 free batches (which would read
    over 200/s over 12 timed steps)."""
    period, ready = 0.010, 12

    class ReadAhead:
        def __iter__(self) -> Iterator[tuple[torch.Tensor, None]]:
            made: queue.Queue[int] = queue.Queue(maxsize=ready)

            def produce() -> None:
                for i in itertools.count():
                    made.put(i)
                    time.sleep(period)

            threading.Thread(target=produce, daemon=True).start()
            while True:
                yield torch.tensor([made.get()]), None

    step = _Recording()
    run = measure(step, ReadAhead(), steps=12, warmup=2, batch_size=1, settle_s=0.3)
    assert run.fed_images_per_second < 1.25 / period
    assert run.host_wait_fraction > 0.5


def test_device_ms_is_none_off_cuda() -> None:
    from shardkit.bench.step_timing import device_ms

    assert device_ms(lambda: torch.ones(3) * 2, 2, torch.device("cpu")) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_ms_counts_kernels_of_every_thread() -> None:
    """A matmul run in another thread is counted (the GPU route decodes and augments in threads)."""
    import threading

    from shardkit.bench.step_timing import device_ms

    a = torch.randn(2048, 2048, device="cuda")

    def work() -> None:
        def matmul() -> None:
            a @ a
            torch.cuda.synchronize()

        t = threading.Thread(target=matmul)
        t.start()
        t.join()

    one = device_ms(lambda: a @ a, 4, torch.device("cuda"))
    threaded = device_ms(work, 4, torch.device("cuda"))
    assert one is not None and threaded is not None and one > 0
    assert 0.5 * one < threaded < 2 * one, (one, threaded)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_the_step_trains_on_uint8_and_on_normalised_batches(dtype: torch.dtype) -> None:
    """uint8 batches are normalised inside the step's loss function; float ones are taken as they are."""
    step = TrainStep("resnet18", 3, torch.device("cpu"), compile=False)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8).to(dtype)
    before = [p.detach().clone() for p in step.net.parameters()]
    step(images, torch.tensor([0, 2]))
    assert all(p.grad is None for p in step.net.parameters())  # dropped after the update
    assert any(not torch.equal(a, b) for a, b in zip(before, step.net.parameters(), strict=True))
    assert not step.opt.defaults.get("fused")  # fused SGD is for CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_step_uses_fused_sgd_on_cuda() -> None:
    step = TrainStep("resnet18", 3, torch.device("cuda"), compile=False)
    assert step.opt.defaults.get("fused") is True


def test_gpu_times_are_taken_after_every_timed_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profiler session slows every launch after it in the process: run_contenders profiles each
    contender on one more loader once all timed runs are over, and sets the figures on its runs."""
    events: list[str] = []

    class CudaLike(_Recording):
        device = torch.device("cuda")  # only read: nothing runs on a device

    def fake_device_ms(work: Any, n: int, device: torch.device) -> float:
        events.append("profile")
        work()
        return 2.5

    monkeypatch.setattr(step_timing, "device_ms", fake_device_ms)
    step = CudaLike()
    build = lambda: [(torch.tensor([i]), None) for i in range(40)]  # noqa: E731
    runs = train.run_contenders({"a": (step, build), "b": (step, build)}, steps=3, warmup=1, batch_size=1,
                                repeats=2, settle_s=0, after_run=lambda name, rep, run: events.append("run"))
    assert events[:4] == ["run"] * 4 and set(events[4:]) == {"profile"} and len(events) == 8
    assert all(r.step_gpu_ms == 2.5 and r.loader_gpu_ms_per_batch == 2.5 for rs in runs.values() for r in rs)


def test_a_long_run_is_said_with_its_and_the_bench_s_length(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A step on the CPU at the defaults ran for hours without a word: from the first synthetic
    run's warm-up steps after its first (an estimate, "about"), and else once that run has timed
    the step (the least), how long the run takes goes to ``paced``, and the bench says it (and its
    runs' total) when it is over a minute, once."""
    clock = _Clock()

    class Slow(_Recording):
        def __call__(self, images: torch.Tensor, labels: Any, /) -> None:
            clock.now += 2.0  # two seconds a step, as ResNet-18 at 224 on two cores

    monkeypatch.setattr(train, "time", clock)
    monkeypatch.setattr(step_timing, "time", clock)
    told: list[tuple[float, bool]] = []

    def paced(seconds: float, early: bool = False) -> bool:
        told.append((seconds, early))
        return early and saying

    saying = False
    measure(Slow(), [(torch.tensor([i]), None) for i in range(30)], steps=5, warmup=1, batch_size=1, settle_s=0,
            paced=paced)
    assert told == [(pytest.approx(2.0 * (3 * (1 + 5) + 5)), False)]  # two synthetic runs, the lead-in, the fed run
    told.clear()  # with warm-up steps after the first: said from them, before the first timed step
    measure(Slow(), [(torch.tensor([i]), None) for i in range(30)], steps=5, warmup=3, batch_size=1, settle_s=0,
            paced=paced)
    assert told == [(pytest.approx(2.0 * (3 * (3 + 5) + 5)), True), (pytest.approx(2.0 * (3 * (3 + 5) + 5)), False)]
    told.clear()
    saying = True  # said early: not again
    measure(Slow(), [(torch.tensor([i]), None) for i in range(30)], steps=5, warmup=3, batch_size=1, settle_s=0,
            paced=paced)
    assert told == [(pytest.approx(2.0 * (3 * (3 + 5) + 5)), True)]
    assert train_report.say_if_long(6, 2.0 * (3 * 110 + 100))
    assert capsys.readouterr().err == ("bench: its 6 runs take at least 86 min, each at least 14 min (--steps, "
                                       "--warmup, --repeats, --model, --size and --batch-size set it)\n")
    assert train_report.say_if_long(6, 2.0 * (3 * 110 + 100), early=True)
    assert capsys.readouterr().err.startswith("bench: its 6 runs take about 86 min, each about 14 min (--steps")
    assert not train_report.say_if_long(6, 59.0)
    assert capsys.readouterr().err == ""
