"""Compiling ahead in a thread: once per key, and a first use that waits for it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from shardkit.transforms import gpu_ahead


def test_a_compile_runs_once_per_key_and_a_use_waits_for_it() -> None:
    done: list[str] = []
    gate = threading.Event()

    def slow() -> None:
        gate.wait(10)
        done.append("slow")

    key = ("test", object())
    assert gpu_ahead.ahead(key, slow)
    assert not gpu_ahead.ahead(key, lambda: done.append("again"))  # started before: not run again
    gpu_ahead.wait(key, timeout=0.05)
    assert done == []  # still held at the gate
    threading.Timer(0.1, gate.set).start()
    gpu_ahead.wait(key)  # the first use waits for the compile in flight
    assert done == ["slow"]
    gpu_ahead.wait(("test", "never started"))  # nothing to wait for


def test_a_failed_compile_is_left_to_the_first_use() -> None:
    def broken() -> None:
        raise RuntimeError("no compiler here")

    key = ("test", object())
    gpu_ahead.ahead(key, broken)
    gpu_ahead.wait(key)  # returns: the real launch compiles again and raises where the caller sees it


def test_the_compile_may_launch_what_waits_for_it() -> None:
    """The compile's own launch calls wait() for its key: from its own thread that returns at once."""
    key = ("test", object())
    ran: list[bool] = []

    def compile() -> None:
        gpu_ahead.wait(key)
        ran.append(True)

    gpu_ahead.ahead(key, compile)
    gpu_ahead.wait(key)
    assert ran == [True]


def test_the_kernel_launch_waits_for_its_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_kernel.launch joins a compile started for its own key (device, output size) before it
    launches; another size does not wait."""
    from shardkit.transforms import gpu_kernel

    launched: list[tuple[int, int]] = []
    monkeypatch.setattr(gpu_kernel, "_kernel", lambda: _Recorder(launched))
    gate, compiled = threading.Event(), []

    def compile() -> None:
        gate.wait(10)
        compiled.append(True)

    assert gpu_ahead.ahead(("resize", None, 6, 7), compile)  # CPU tensors: device index None
    geom = torch.zeros((1, 12), dtype=torch.int32)
    gpu_kernel.launch(torch.zeros(1, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64), geom,
                      torch.empty((1, 3, 5, 5), dtype=torch.uint8))  # another size: no wait
    assert launched == [(5, 5)] and not compiled
    threading.Timer(0.1, gate.set).start()
    gpu_kernel.launch(torch.zeros(1, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64), geom,
                      torch.empty((1, 3, 6, 7), dtype=torch.uint8))
    assert compiled == [True] and launched == [(5, 5), (6, 7)]


def test_forking_the_workers_waits_for_a_compile_in_flight() -> None:
    """raise_failures opens its source (where a DataLoader forks its workers) only once no compile
    runs in a thread: a child must not hold a copy of a compiler stopped mid-way."""
    from shardkit.loader.run.stream import raise_failures

    gate, order = threading.Event(), []

    def compile() -> None:
        gate.wait(10)
        order.append("compiled")

    class Source:
        def __iter__(self) -> Iterator[Any]:
            order.append("opened")
            return iter([])

    assert gpu_ahead.ahead(("test", object()), compile)
    threading.Timer(0.1, gate.set).start()
    assert list(raise_failures(Source())) == []
    assert order == ["compiled", "opened"]


class _Recorder:
    """Stands for the compiled kernel: records each launch's output size."""

    def __init__(self, launched: list[tuple[int, int]]) -> None:
        self.launched = launched

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, OH, OW, **kw: self.launched.append((OH, OW))


def test_the_warm_up_launches_are_in_bounds_and_right_under_the_interpreter() -> None:
    """What warm_up launches (a 2x2 image, resized whole; the ragged kernel's place of 12 bytes)
    runs under Triton's interpreter and gives the eager reference's pixels: no read or write
    outside its tensors."""
    from tests.transforms.interpreted import run_interpreted

    out = run_interpreted(
        "import torch\n"
        "from shardkit.transforms import gpu_kernel, gpu_ragged_kernel\n"
        "from shardkit.transforms.gpu import _eager_resize\n"
        "flat, offsets, geom = gpu_kernel.tiny_batch(torch.device('cpu'), (3, 5))\n"
        "got = torch.empty((1, 3, 3, 5), dtype=torch.uint8)\n"
        "gpu_kernel.launch(flat, offsets, geom, got)\n"
        "ref = torch.empty_like(got)\n"
        "_eager_resize(flat, offsets, geom, ref)\n"
        "flat, offsets, geom = gpu_kernel.tiny_batch(torch.device('cpu'), (2, 2))\n"
        "ragged = torch.empty(12, dtype=torch.uint8)\n"
        "gpu_ragged_kernel.launch(flat, offsets, geom, ragged, torch.tensor([[0, 4, 2]]), 4)\n"
        "print(int((got.int() - ref.int()).abs().max()), ragged.tolist() == flat.tolist())\n"
    )
    diff, ragged_same = out.split()
    assert int(diff) <= 1 and ragged_same == "True"  # a whole 2x2 resize to 2x2 is the image itself
