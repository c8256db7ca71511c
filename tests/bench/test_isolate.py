"""Each run of an isolated training bench in a process of its own."""

from __future__ import annotations

import os

import pytest

from shardkit.bench.isolate import in_fresh_process


def _pid() -> int:
    return os.getpid()


def _refuse(what: str) -> None:
    raise ValueError(f"no {what}")


def _die() -> None:
    os._exit(3)


def test_each_call_is_a_new_process_that_is_gone_after_it() -> None:
    first, second = in_fresh_process(_pid), in_fresh_process(_pid)
    assert len({first, second, os.getpid()}) == 3
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)


def test_an_exception_comes_back_as_itself_and_a_death_is_named() -> None:
    with pytest.raises(ValueError, match="no batch"):
        in_fresh_process(_refuse, "batch")
    with pytest.raises(RuntimeError, match="the run of dali@8 died in its process"):
        in_fresh_process(_die, what="the run of dali@8")
