"""Each measured run in a Python process of its own, started for it and gone after it.

A training bench that runs every contender in one process measures each beside the leftovers of
the others: a CUDA context and its caching allocator, threads of a DALI pipeline, persistent
workers or feeder processes not yet reaped, a compiled model warmed by someone else's batches.
Users run one loader per job; a fair bench does too. A spawned process (never forked: a forked
CUDA context is unusable) starts with nothing but the interpreter and pays its own start-up
(imports, ``torch.compile``, the loader's workers) before its timed steps, as a job would.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

__all__ = ["in_fresh_process"]

T = TypeVar("T")


def in_fresh_process(work: Callable[..., T], *args: object, what: str = "the run") -> T:
    """``work(*args)`` in a newly spawned process that exits when it returns; its result (or its
    exception) comes back pickled. ``work`` must be importable by name (a module-level function).

    Raises:
        RuntimeError: the process died without an answer (killed, out of memory, a crash in native
            code), naming ``what``.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        try:
            return pool.submit(work, *args).result()
        except BrokenProcessPool:
            raise RuntimeError(f"{what} died in its process without an answer (killed, out of memory, or a "
                               f"crash in native code)") from None
