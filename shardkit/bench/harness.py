"""Time loaders side by side: warm-up excluded, repetitions in alternating order.

A :class:`Contender` builds a fresh loader (each ``iter()`` over it is one epoch of
``(images, labels, ...)``). :func:`run_once` builds it, times its first batch, skips ``warmup``
batches (and any more a ShardLoader with ``feeders="auto"`` takes to settle: :func:`settled`),
then times the rest of ``epochs`` epochs while sampling CPU time and RSS of the whole process
tree; the loader and its workers are gone before it returns, so contenders never overlap.
:func:`run_alternating` runs every contender ``repeats`` times, reversing the order on every
other repetition (A B C, C B A, …) so slow drift of the machine hits all of them alike.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit import _compat
from shardkit.bench.proctree import TreeSampler, descendants, wait_for_exit

Progress = Callable[[str, int], None]
"""Called with ``(contender name, batches just delivered)``."""


@dataclass(frozen=True)
class Contender:
    """One loader to measure. ``build()`` returns a fresh loader; ``stages(loader)`` optionally
    returns its own per-stage counters (ShardLoader's ``stats``)."""

    name: str
    label: str
    build: Callable[[], Iterable[Any]]
    baseline: bool = False
    stages: Callable[[Any], dict[str, float] | None] | None = None


@dataclass(frozen=True)
class RunResult:
    """One timed run of one contender.

    ``images``/``seconds``: images delivered and wall seconds in the timed part (after warm-up);
    ``first_batch_s``: from starting to build the loader to holding its first batch;
    ``cpu_seconds``/``cores_busy``: CPU time of the process tree in the timed part, and that per
    wall second; ``peak_rss_bytes``/``peak_pss_bytes``: largest sum of RSS / PSS over the tree
    in the timed part (PSS splits pages shared by forked workers; None where unavailable);
    ``wait_fraction``: share of the timed part spent blocked on the next batch (and, on CUDA,
    on its copy to the device); ``load_average``: the machine's 1-minute load average at the end
    (other work competing for the cores shows here).
    """

    images: int
    seconds: float
    first_batch_s: float
    cpu_seconds: float
    cores_busy: float
    peak_rss_bytes: int
    wait_fraction: float
    batch_shape: tuple[int, ...]
    stages: dict[str, float] | None = None
    peak_pss_bytes: int | None = None
    load_average: float | None = None

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0


def _to_device(images: Any, device: str) -> Any:
    """A batch's images on ``device`` (a tensor, or a list of tensors for detection batches)."""
    if isinstance(images, (list, tuple)):
        return [_to_device(im, device) for im in images]
    if (device.startswith("cuda") and getattr(images, "device", None) is not None
        and images.device.type != "cuda"):
        return images.to(device, non_blocking=True)
    return images


def _shape(images: Any) -> tuple[int, ...]:
    """``images.shape``, or ``(n,)`` for a list of ``n`` images of different sizes."""
    return tuple(images.shape) if hasattr(images, "shape") else (len(images),)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def steady(loader: Any) -> None:
    """A ShardLoader whose feeders start while its first batches come from this process
    (``feeders="auto"``): wait for them to start (its trial then takes batches until
    :func:`settled`)."""
    wait = getattr(loader, "wait_for_feeders", None)
    if callable(wait):
        wait()


def settled(loader: Any) -> bool:
    """Whether ``loader`` delivers from where it stays (a ShardLoader with ``feeders="auto"`` has
    finished timing the loop both ways); any other loader always does."""
    return bool(getattr(loader, "settled", True))


def _stop_now(it: Any, loader: Any) -> None:
    """A run stopped part-way: shut its loader's worker processes down now, not whenever the
    traceback that holds the loader is dropped. A signal sent to the whole process group (``timeout``,
    a scheduler) ends a DataLoader's workers too, and torch's SIGCHLD handler then raises "DataLoader
    worker ... is killed by signal" in whatever this process runs next, the report of the finished
    runs included, for as long as the iterator keeps them registered; so SIGCHLD is set aside
    meanwhile, where this is the main thread."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGCHLD, signal.SIG_DFL) if main else None
    try:
        # a DataLoader's iterator; a generator over one (webdataset's WebLoader), closed; the loader
        stops = (lambda: _compat.shut_down_iterator(it), getattr(it, "close", None), getattr(loader, "close", None))
        for stop in stops:
            if callable(stop):
                with contextlib.suppress(Exception):  # a worker the same signal ended: it is gone either way
                    stop()
    finally:
        if main:
            signal.signal(signal.SIGCHLD, before)


def run_once(contender: Contender, *, epochs: int, warmup: int, device: str = "cpu",
             progress: Progress | None = None) -> RunResult:
    """Build ``contender``'s loader, iterate ``epochs`` epochs and time all but ``warmup`` batches.

    Raises:
        ValueError: ``epochs < 1``, ``warmup < 0``, or no batch was left to time.
    """
    if epochs < 1 or warmup < 0:
        raise ValueError(f"need epochs >= 1 and warmup >= 0, got {epochs}, {warmup}")
    before = set(descendants())
    t_build = time.perf_counter()
    loader = contender.build()
    first_batch_s = -1.0
    seen = images = 0
    wait = 0.0
    shape: tuple[int, ...] = ()
    sampler: TreeSampler | None = None
    t_start = 0.0
    it: Any = None
    try:
        for _epoch in range(epochs):
            it = iter(loader)
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                batch_images = _to_device(batch[0], device)
                _sync(device)
                t1 = time.perf_counter()
                seen += 1
                if first_batch_s < 0:
                    first_batch_s, shape = t1 - t_build, _shape(batch_images)
                    steady(loader)
                if sampler is not None:
                    images += len(batch[1])  # labels, or one target per image
                    wait += t1 - t0
                elif seen >= warmup and settled(loader):  # the warm-up ends; the timed part starts now
                    sampler, t_start = TreeSampler().start(), time.perf_counter()
                if progress is not None:
                    progress(contender.name, 1)
            it = None
    except BaseException:  # stopped (Ctrl-C, SIGTERM), or failed: its workers go now
        _stop_now(it, loader)
        raise
    _sync(device)
    t_end = time.perf_counter()
    if sampler is None or images == 0:
        raise ValueError(f"{contender.name}: {seen} batches in {epochs} epoch(s) leave none to "
                         f"time after {warmup} warm-up batches")
    usage = sampler.stop()
    stages = contender.stages(loader) if contender.stages is not None else None
    # Drop the loader and wait for the workers it started to exit before anything else runs.
    workers = set(descendants()) - before
    del loader, batch, batch_images
    gc.collect()
    wait_for_exit(workers, timeout=30.0)
    seconds = t_end - t_start
    return RunResult(images=images, seconds=seconds, first_batch_s=first_batch_s,
                     cpu_seconds=usage.cpu_seconds, cores_busy=usage.cpu_seconds / seconds,
                     peak_rss_bytes=usage.peak_rss_bytes, wait_fraction=wait / seconds,
                     batch_shape=shape, stages=stages, peak_pss_bytes=usage.peak_pss_bytes,
                     load_average=_load())


def _not_too_many(record: logging.LogRecord) -> bool:
    from shardkit.loader.arguments import TOO_MANY_WORKERS

    return record.msg is not TOO_MANY_WORKERS


@contextlib.contextmanager
def quiet_worker_count() -> Iterator[None]:
    """Without the warnings that a loader starts more workers than the cores: torch's
    ``DataLoader``'s (on building one and again on its first ``iter()``) and ShardLoader's (on
    building one). The bench runs the worker count it is given on purpose, a fresh loader each run,
    and says so once in its own words where that matters."""
    loader_log = logging.getLogger("shardkit.loader")
    loader_log.addFilter(_not_too_many)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            yield
    finally:
        loader_log.removeFilter(_not_too_many)


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def alternating_order(names: Sequence[str], repeats: int) -> list[list[str]]:
    """Run order per repetition: as given, reversed, as given, …

    Example:
        >>> alternating_order(["a", "b", "c"], 3)
        [['a', 'b', 'c'], ['c', 'b', 'a'], ['a', 'b', 'c']]
    """
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(repeats)]


def run_alternating(contenders: Sequence[Contender], *, repeats: int, epochs: int, warmup: int,
                    device: str = "cpu", progress: Progress | None = None,
                    before_run: Callable[[Contender], None] | None = None,
                    after_run: Callable[[str, int, RunResult], None] | None = None,
                    ) -> dict[str, list[RunResult]]:
    """Run each contender ``repeats`` times in alternating order; results by name, in run order.

    ``before_run(contender)`` is called before each run (e.g. to drop the page cache) and
    ``after_run(name, repetition, result)`` after it.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    by_name = {c.name: c for c in contenders}
    results: dict[str, list[RunResult]] = {c.name: [] for c in contenders}
    for rep, order in enumerate(alternating_order([c.name for c in contenders], repeats)):
        for name in order:
            if before_run is not None:
                before_run(by_name[name])
            with quiet_worker_count():
                result = run_once(by_name[name], epochs=epochs, warmup=warmup, device=device,
                                  progress=progress)
            results[name].append(result)
            if after_run is not None:
                after_run(name, rep, result)
    return results
