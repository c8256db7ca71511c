"""Compiling ahead in a thread: once per key, and a first use that waits for it."""

from __future__ import annotations

import threading
import time

from shardkit.transforms import gpu_ahead


def test_a_compile_runs_once_per_key_and_a_use_waits_for_it() -> None:
    done: list[str] = []
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        done.append("slow")

    key = ("test", object())
    assert gpu_ahead.ahead(key, slow)
    assert not gpu_ahead.ahead(key, lambda: done.append("again"))  # started before: not run again
    started.wait(5)
    assert done == []
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
