"""The feeders' log relay (``shardkit.loader.feed.logs``) as real processes: a spawned
"feeder" and a worker it forks log, and the records reach the handlers of this process."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Iterator

import pytest

from shardkit.loader.feed.logs import LogRelay, relay_to

pytestmark = pytest.mark.timeout(120)


def _worker() -> None:
    logging.getLogger("shardkit.test").warning("from its worker")
    time.sleep(0.5)  # a record reaches the pipe within milliseconds; one logged as a process exits may be lost


def _feeder(queue: object, levels: dict[str, int]) -> None:
    relay_to(queue, levels)
    logging.getLogger("shardkit.test").warning("from the feeder")  # before the fork: the worker must still relay
    logging.getLogger("shardkit.test").debug("below the level")
    worker = multiprocessing.get_context("fork").Process(target=_worker)
    worker.start()
    worker.join()
    time.sleep(0.5)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def kept() -> Iterator[_Keep]:
    keep, logger = _Keep(), logging.getLogger("shardkit.test")
    logger.addHandler(keep)
    try:
        yield keep
    finally:
        logger.removeHandler(keep)


def _run_feeder(relay: LogRelay) -> None:
    ctx = multiprocessing.get_context("spawn")
    feeder = ctx.Process(target=_feeder, args=(relay.queue, relay.levels))
    feeder.start()
    feeder.join(timeout=60)
    assert feeder.exitcode == 0


def test_a_feeder_and_the_worker_it_forks_after_logging_both_reach_this_process(kept: _Keep) -> None:
    relay = LogRelay(multiprocessing.get_context("spawn"))
    _run_feeder(relay)
    relay.close()
    assert sorted(kept.messages) == ["from its worker", "from the feeder"]  # not the DEBUG one: WARNING here


def test_a_failing_handler_does_not_stop_the_relay(kept: _Keep, capsys: pytest.CaptureFixture[str]) -> None:
    class Failing(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("disk full")

    failing, logger = Failing(), logging.getLogger("shardkit.test")
    logger.addHandler(failing)  # after kept's: kept sees each record before this one raises
    try:
        relay = LogRelay(multiprocessing.get_context("spawn"))
        _run_feeder(relay)
        relay.close()
    finally:
        logger.removeHandler(failing)
    assert "a log handler failed on a feeder's record" in capsys.readouterr().err
    assert sorted(kept.messages) == ["from its worker", "from the feeder"]  # the relay went on after a failure
