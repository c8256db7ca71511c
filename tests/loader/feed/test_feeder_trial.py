"""feeders="auto" once its feeders are up: the loop is timed fed by them, then fed from this
process, and the faster side stays, with the batches of a loader without feeders throughout.
PaceTrial on its own, then a loader on the CPU whose loop is made slower on one side."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from shardkit.loader.feed.labels import SlotLabels
from shardkit.loader.feed.trial import PaceTrial
from tests.loader.feed.test_feeders import _epochs, _loader, _same

pytestmark = pytest.mark.timeout(240)


def _run(trial: PaceTrial, pace: dict[str, float], requests: int) -> list[str]:
    """``requests`` requests of a loop taking ``pace[side]`` seconds per batch on each side; the
    side each batch came from."""
    now, sides = 0.0, []
    for _ in range(requests):
        trial.request(now)
        sides.append(trial.place)
        now += pace[trial.place]
    return sides


def test_the_trial_times_the_feeders_then_this_process_and_keeps_the_faster() -> None:
    trial = PaceTrial(skip=2, window=4)
    sides = _run(trial, {"feeders": 0.010, "here": 0.012}, 30)
    # the first request starts the clock, 2 intervals are skipped and 4 timed: the 7th request,
    # which ends the 4th, is served from the other side (its interval is one of those skipped)
    assert sides[:6] == ["feeders"] * 6 and sides[6:12] == ["here"] * 6
    assert trial.decided == "feeders" and set(sides[12:]) == {"feeders"}
    assert trial.paces == pytest.approx({"feeders": 0.010, "here": 0.012})


def test_on_a_tie_or_a_gain_under_the_margin_the_route_stays_here() -> None:
    for feeders in (0.012, 0.0119):  # equal; 0.8% faster (the margin is 2%)
        trial = PaceTrial(skip=1, window=3)
        _run(trial, {"feeders": feeders, "here": 0.012}, 20)
        assert trial.decided == "here" and trial.place == "here"


def test_the_median_ignores_a_few_slow_steps_and_the_clock_restarts_at_an_epoch() -> None:
    trial = PaceTrial(skip=0, window=5)
    for t in (0.0, 0.01, 0.02, 2.02, 2.03, 2.04):  # one 2 s step (a checkpoint, a recompile)
        trial.request(t)
    assert trial.paces == {"feeders": pytest.approx(0.01)} and trial.place == "here"
    trial.request(10.0)
    trial.restart_clock()  # a new epoch: the time between epochs is not an interval
    for t in (50.0, 50.02, 50.04, 50.06, 50.08, 50.10):
        trial.request(t)
    assert trial.paces["here"] == pytest.approx(0.02) and trial.decided == "feeders"


def _auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """feeders="auto" choosing one feeder on the CPU, with a short trial (1 batch skipped and 4
    timed on each side)."""
    from shardkit.loader import loader as loader_module

    monkeypatch.setattr(loader_module, "feeder_count", lambda *args, **kwargs: (1, SlotLabels()))
    monkeypatch.setattr(loader_module, "PaceTrial", functools.partial(PaceTrial, skip=1, window=4))


def _train(loader: Any, slower: str, epochs: int = 3) -> tuple[list[Any], list[str]]:
    """``epochs`` epochs of a loop that takes 40 ms more per batch when fed from ``slower``; the
    batches, and where the loader stood after each."""
    loader.wait_for_feeders()  # started now: the trial begins at the first batch
    got, places = [], []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            got.append(batch)
            place = "feeders" if loader._pool is not None and loader._trial.place == "feeders" else "here"
            places.append(place)
            time.sleep(0.05 if place == slower else 0.01)
    return got, places


@pytest.mark.parametrize("slower", ["feeders", "here"])
def test_the_loader_keeps_the_side_that_fed_the_loop_faster_with_the_same_batches(
        packed: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, slower: str) -> None:
    """Both ways: the loop slower fed by the feeders keeps the route here (the feeders stopped,
    ``feeders`` 0); slower fed from here keeps the feeders (this process's workers stopped). The
    batches, labels and pixels are those of feeders=0 across the switches and epochs."""
    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=3)
    _auto(monkeypatch)
    with _loader(packed) as loader, caplog.at_level(logging.INFO, logger="shardkit.loader"):
        got, places = _train(loader, slower)
        # 5 batches from the feeders (1 interval skipped, 4 timed), then 6 from here: 5, and 1
        # more as the interval from the last batch of the first epoch (9 batches) to the first
        # of the next is not the loop's; the side kept from the 12th batch on
        assert places[:5] == ["feeders"] * 5 and places[5:11] == ["here"] * 6
        kept = "here" if slower == "feeders" else "feeders"
        assert loader._trial.decided == kept and set(places[11:]) == {kept}
        if kept == "here":
            assert loader.feeders == 0 and loader._pool is None and loader._run is not None
        else:
            assert loader.feeders == 1 and loader._pool is not None and loader._run is None
    _same(want, got)
    [line] = [r.getMessage() for r in caplog.records if "feeders='auto'" in r.getMessage()]
    assert ("keeps its 1 feeder processes" if kept == "feeders" else "runs the route in this process") in line


def test_a_resume_point_taken_during_the_trial_is_exact(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """state_dict() while the trial has the route here resumes to exactly the batches not yet
    delivered."""
    with _loader(packed, feeders=0) as plain:
        want = [k for _, _, k in plain]
    _auto(monkeypatch)
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        it = iter(loader)
        first = [next(it)[2] for _ in range(7)]  # the 6th and 7th from here
        assert loader._trial.place == "here" and loader._trial.decided is None
        state = loader.state_dict()
    with _loader(packed, feeders=0) as resumed:
        resumed.load_state_dict(state)
        rest = [k for _, _, k in resumed]
    assert first + rest == want
