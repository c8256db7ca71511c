"""PaceTrial on its own, the state of feeders="auto"'s trial: phases given to each side in turn
by batch number, which intervals are timed, and which side it keeps (the loader with it:
test_feeder_trial.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardkit.loader.feed.trial import PaceTrial


def _run(trial: PaceTrial, pace: Callable[[int, str], float], batches: int, *,
         up: Callable[[int], bool] = lambda n: True, epoch: int = 0) -> list[str]:
    """The loader's bookkeeping over ``batches`` requests of a loop taking ``pace(n, side)``
    seconds over batch ``n`` from ``side``, the feeders ``up(n)`` when batch ``n`` is asked for,
    ``epoch`` batches an epoch (0: one epoch); the side of each batch."""
    now, side, since, sides = 0.0, "here", 0, list[str]()
    for n in range(batches):
        first = epoch > 0 and n % epoch == 0
        if first:
            trial.restart_clock()
        trial.request(now, n, up=up(n))
        want = trial.place(n) if up(n) else "here"
        if want != side:
            side, since = want, 0
        trial.fetching(n, want, since_switch=since, fresh=first or since == 0)
        sides.append(want)
        now, since = now + pace(n, want), since + 1
    return sides


def _steady(feeders: float, here: float) -> Callable[[int, str], float]:
    return lambda n, side: feeders if side == "feeders" else here


def test_the_trial_gives_phases_to_each_side_in_turn_and_keeps_the_faster() -> None:
    trial = PaceTrial(skip=2, window=4)  # phases of 6 batches: the feeders' first
    sides = _run(trial, _steady(0.008, 0.012), 30)
    assert sides[:6] == ["feeders"] * 6 and sides[6:12] == ["here"] * 6
    assert trial.decided == "feeders" and set(sides[12:]) == {"feeders"}  # judged at the 13th request
    assert trial.paces == pytest.approx({"feeders": 0.008, "here": 0.012})


def test_the_first_batches_after_a_switch_are_not_timed() -> None:
    slow_start = 1.0  # the 4 batches after each switch: a side filling its pipeline
    trial = PaceTrial(skip=4, window=2)  # phases of 6: 2 batches timed in each
    _run(trial, lambda n, side: slow_start if n % 6 < 4 else _steady(0.008, 0.012)(n, side), 30)
    assert trial.paces == pytest.approx({"feeders": 0.008, "here": 0.012})


def test_on_a_tie_or_a_gain_under_the_margin_the_route_stays_here() -> None:
    for feeders, kept in ((0.012, "here"), (0.0103, "here"), (0.0100, "feeders")):  # 0%, 14%, 17% faster
        trial = PaceTrial(skip=1, window=3)
        sides = _run(trial, _steady(feeders, 0.012), 24)
        assert trial.decided == kept and set(sides[16:]) == {kept}  # within the band: two more phases


def test_a_phase_begun_before_the_feeders_were_up_is_not_timed() -> None:
    """Up from batch 1: phase 0's feeders batches (made slow here) are served, not timed; the
    feeders' pace is phase 2's."""
    trial = PaceTrial(skip=2, window=4)
    sides = _run(trial, lambda n, side: 1.0 if n < 6 else _steady(0.008, 0.012)(n, side), 36, up=lambda n: n >= 1)
    assert sides[0] == "here" and sides[1:6] == ["feeders"] * 5 and sides[6:12] == ["here"] * 6
    assert trial.paces == pytest.approx({"feeders": 0.008, "here": 0.012}) and set(sides[18:]) == {"feeders"}


def test_batches_served_from_here_in_a_feeders_phase_are_not_timed() -> None:
    """Feeders down at batches 2 and 3 (a restart) in phase 0, timed, of the feeders: the
    batches made here meanwhile (slow here) do not count as the feeders'; the feeders' pace is
    then phase 2's (phase 0 keeps 1 interval, under half a window)."""
    trial = PaceTrial(skip=1, window=4)  # phases of 5
    down = {2, 3}
    pace = lambda n, side: 1.0 if n in down else _steady(0.008, 0.012)(n, side)  # noqa: E731
    sides = _run(trial, pace, 30, up=lambda n: n not in down)
    assert [sides[n] for n in sorted(down)] == ["here", "here"]
    assert trial.paces == pytest.approx({"feeders": 0.008, "here": 0.012})


def test_phases_go_by_batch_number_so_ranks_that_step_together_switch_together() -> None:
    """Feeders up at batch 3 on one rank and 8 on another: from batch 8 on, every batch of both
    comes from the same side until the first decides (at 18)."""
    early, late = PaceTrial(skip=2, window=4), PaceTrial(skip=2, window=4)
    a = _run(early, _steady(0.008, 0.012), 36, up=lambda n: n >= 3)
    b = _run(late, _steady(0.008, 0.012), 36, up=lambda n: n >= 8)
    assert a[:3] == ["here"] * 3 and a[3:6] == ["feeders"] * 3  # phase 0: not timed
    assert a[6:12] == ["here"] * 6 and a[12:18] == ["feeders"] * 6 and set(a[18:]) == {"feeders"}
    assert early.decided == "feeders" and a[8:18] == b[8:18]
    assert late.decided == "feeders" and set(b[24:]) == {"feeders"}  # timed phases 2 and 3


def test_the_batches_around_each_epoch_boundary_are_not_timed() -> None:
    """Epochs of 4: the last batch's interval holds 30 s between epochs, the first batch of the
    next comes from a delivery opened anew (1 s here); neither is timed, and a side's intervals
    are pooled over its phases until it has half a window (3 of a window of 6)."""
    trial = PaceTrial(skip=0, window=6)
    now, pace, decided_at = 0.0, {"feeders": 0.01, "here": 0.02}, None
    for n in range(40):
        if n % 4 == 0:
            trial.restart_clock()
            now += 30.0
        trial.request(now, n, up=True)
        if trial.decided is not None and decided_at is None:
            decided_at = n
        side = trial.place(n)
        trial.fetching(n, side, since_switch=n % 6, fresh=n % 4 == 0 or n % 6 == 0)
        now += 1.0 if n % 4 == 0 else pace[side]
    assert trial.paces == pytest.approx({"feeders": 0.01, "here": 0.02}) and trial.decided == "feeders"
    # phases 0 and 1 time 2 intervals each (under half a window); with phases 2 and 3 each side has 3+
    assert decided_at == 24


def test_a_loop_that_takes_one_batch_per_iteration_leaves_the_feeders() -> None:
    """No interval to time: after PHASES timed phases the trial ends keeping the feeders (as
    before there was a trial)."""
    trial = PaceTrial(skip=1, window=2)
    sides = _run(trial, _steady(0.01, 0.01), trial.phases * trial.length + 1, epoch=1)
    assert trial.decided == "feeders" and trial.paces == {} and sides[-1] == "feeders"
    assert "not timed fed by 2 feeder processes, not timed fed from this process" in trial.summary(2)



def test_a_gain_far_from_the_margin_is_decided_after_one_phase_of_each() -> None:
    for feeders, kept in ((0.008, "feeders"), (0.0115, "here")):  # 33% and 4% shorter: out of the band
        trial = PaceTrial(skip=1, window=3)  # phases of 4
        sides = _run(trial, _steady(feeders, 0.012), 12)
        assert trial.decided == kept and set(sides[8:]) == {kept}


def test_a_gain_near_the_margin_is_timed_again_and_decided_on_both_phases_of_each() -> None:
    """The feeders' first phase timed 14% shorter (a noisy moment), their second 25%: one phase of
    each would have kept the route; the pooled medians (19.6% shorter) keep the feeders. Without
    the band, the first pair decides."""
    def pace(n: int, side: str) -> float:
        return 0.012 if side == "here" else (0.0103 if n < 8 else 0.009)

    trial = PaceTrial(skip=1, window=3)
    sides = _run(trial, pace, 24)
    assert sides[8:12] == ["feeders"] * 4 and sides[12:16] == ["here"] * 4  # phases 2 and 3 timed too
    assert trial.decided == "feeders" and set(sides[16:]) == {"feeders"}
    assert trial.paces == pytest.approx({"feeders": (0.0103 + 0.009) / 2, "here": 0.012})
    without = PaceTrial(skip=1, window=3, band=0.0)
    _run(without, pace, 24)
    assert without.decided == "here"


def test_the_phases_timed_again_are_one_of_each_side_even_where_one_was_not_timed() -> None:
    """Within the band after phases 0 and 1; phase 3 (this process's) begins with the feeders down
    (not timed): the trial waits for phase 5, this process's next, rather than deciding on two more
    phases of the feeders."""
    trial = PaceTrial(skip=1, window=3)  # phases of 4
    sides = _run(trial, _steady(0.0100, 0.012), 32, up=lambda n: n != 12)
    assert sides[16:20] == ["feeders"] * 4 and sides[20:24] == ["here"] * 4
    assert trial.decided == "feeders" and set(sides[24:]) == {"feeders"}


def test_a_loop_with_no_time_between_batches_on_either_side_keeps_the_feeders() -> None:
    """Both medians 0 (on the device's timeline, a loop that queues nothing between its batches):
    no division by a zero pace; the feeders stay, as on a tie before the band."""
    trial = PaceTrial(skip=1, window=3)
    _run(trial, _steady(0.0, 0.0), 20)
    assert trial.decided == "feeders"


@pytest.mark.parametrize(("here_ms", "feeders_ms", "kept"), [
    (9.34, 8.58, "here"), (9.08, 8.69, "here"), (8.50, 8.60, "here"), (11.04, 9.43, "here"),  # H100, batch 128
    (20.9, 16.6, "feeders"), (18.7, 14.6, "feeders"),  # H200, batch 256
])
def test_the_margin_keeps_the_side_that_was_faster_in_use(here_ms: float, feeders_ms: float, kept: str) -> None:
    """The trials measured with ResNet-18 @176 (docs/performance.md): where three feeders were
    timed 4–15% shorter per batch they then fed the step 0.79–0.91x as fast as the route without
    them; where timed 21–22% shorter, 1.29x. A pace the same in every phase: within the band, the
    phases timed again say the same."""
    trial = PaceTrial(skip=1, window=3)
    _run(trial, _steady(feeders_ms / 1e3, here_ms / 1e3), 24)
    assert trial.decided == kept
