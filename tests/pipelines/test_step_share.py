"""The recipes' fed-step share: rates over the same number of steps, fed and on a fixed batch."""

from __future__ import annotations

import pytest
import torch

from pipelines import step_share
from pipelines.step_share import StepClock, clone_batch, describe_share, measure_share


def test_share_is_the_fed_rate_over_the_rate_on_the_fixed_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]  # a clock the steps advance: the rates do not depend on how busy the machine is
    monkeypatch.setattr(step_share.time, "perf_counter", lambda: now[0])
    clock = StepClock(3)
    for _ in range(6):  # fed steps of 20 ms; the clock keeps the last 3
        now[0] += 0.02
        clock.tick()
    calls = []

    def step() -> float:  # a synthetic step twice as fast
        calls.append(1)
        now[0] += 0.01
        return 0.0

    share = measure_share(step, clock, images_per_step=8)
    assert share is not None and len(calls) == 3
    assert share["share"] == share["fed_images_per_second"] / share["synthetic_images_per_second"]
    assert share["fed_images_per_second"] == pytest.approx(8 / 0.02)  # 8 images per step of 20 ms
    assert share["share"] == pytest.approx(0.5)
    assert describe_share(share, 3).startswith(f"fed-step share {share['share']:.0%}: ")


def test_too_short_a_run_is_not_measured() -> None:
    clock = StepClock(5)
    clock.tick()
    assert measure_share(lambda: 0.0, clock, 8) is None
    assert "not measured" in describe_share(None, 5)


def test_the_fixed_batch_shares_no_buffer() -> None:
    images = [torch.zeros(3, 2, 2)]
    targets = [{"boxes": torch.zeros(1, 4), "labels": torch.ones(1, dtype=torch.int64)}]
    fixed = clone_batch((images, targets))
    images[0].add_(1)
    targets[0]["boxes"].add_(1)
    assert fixed[0][0].sum() == 0 and fixed[1][0]["boxes"].sum() == 0
    assert isinstance(fixed, tuple) and isinstance(fixed[0], list) and isinstance(fixed[1][0], dict)
