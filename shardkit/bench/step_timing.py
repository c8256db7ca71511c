"""Timing a training step: the wall time of ``n`` steps fed from an iterator, and the GPU time
of one step and of one batch of a loader (``torch.profiler``), with when the latter may be taken.

:mod:`shardkit.bench.train` measures with these; any :class:`Step` can be timed (a classifier's,
:mod:`shardkit.bench.train_step`; a detector's, :mod:`shardkit.bench.train_detection`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from shardkit.bench.train_step import synchronize

__all__ = ["Step", "device_ms", "gpu_times", "run_steps"]


class Step(Protocol):
    """What :func:`~shardkit.bench.train.measure` drives: a training step that brings a loader's
    batches to its device."""

    def to_device(self, batch: Any) -> tuple[Any, Any]:
        """A loader's batch ``(images, labels or targets, *rest)`` as the step's inputs on its device."""
        ...

    def clone(self, batch: tuple[Any, Any]) -> tuple[Any, Any]:
        """A copy of what :meth:`to_device` returned that shares no loader buffer (the synthetic run's
        fixed batch: a loader may reuse its buffers for later batches)."""
        ...

    def __call__(self, images: Any, labels: Any, /) -> None:
        """One optimiser step on a batch :meth:`to_device` returned."""
        ...

    def sync(self) -> None:
        """Wait for the step's device work (timings are taken synchronised)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the step runs."""
        ...


def run_steps(step: Step, batches: Iterator[tuple[Any, Any]], n: int) -> tuple[float, float]:
    """Run ``n`` steps on ``batches``; wall seconds (synchronised) and seconds spent in ``next``."""
    step.sync()
    waited, t0 = 0.0, time.perf_counter()
    for _ in range(n):
        w0 = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - w0
        step(images, labels)
    step.sync()
    return time.perf_counter() - t0, waited


def device_ms(work: Callable[[], object], n: int, device: torch.device) -> float | None:
    """Milliseconds of GPU time per call of ``work`` over ``n`` calls: the summed durations of
    the kernels and copies ``torch.profiler`` records on ``device``, from every thread and
    stream of the process. None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            work()
        synchronize(device)
    micros = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return micros / n / 1e3


def gpu_times(step: Step, fed: Iterator[tuple[Any, Any]], fixed: tuple[Any, Any], warmup: int, n: int,
              feeders: int = 0) -> tuple[float | None, float | None]:
    """``(step GPU ms, loader GPU ms per batch)`` over ``n`` profiled calls each (both None with
    ``n=0`` or off CUDA). Take them after every timed run of the process: a profiler session slows
    every launch after it (see the module doc). ``warmup`` fed steps first, so the loader's buffers
    are as in a fed run (a loader slower than the step has none ready) and the loader's profile
    times batches made while it runs, not ones decoded before it. A loader with feeder processes
    (``feeders``) does its device work there, outside this process's profile: None."""
    if n <= 0 or step.device.type != "cuda":
        return None, None
    run_steps(step, fed, warmup)
    step_ms = device_ms(lambda: step(*fixed), n, step.device)
    run_steps(step, fed, warmup)
    return step_ms, None if feeders else device_ms(lambda: next(fed), n, step.device)
