"""What every training-bench report must hold, classification and detection alike, and a stop in
the middle of its runs."""

from __future__ import annotations

from typing import Any

import pytest

from shardkit.bench import train


def check_runs(report: dict[str, Any], names: list[str], repeats: int) -> None:
    """``report`` has a row per contender in ``names`` order with ``repeats`` runs each, positive
    rates, a host wait fraction, share = fed / synthetic per run, and no GPU figures (CPU)."""
    assert [r["name"] for r in report["results"]] == names
    for r in report["results"]:
        assert len(r["runs"]) == repeats
        for run in r["runs"]:
            assert run["fed_images_per_second"] > 0 and run["synthetic_images_per_second"] > 0
            assert 0 <= run["host_wait_fraction"] <= 1
        shares = [run["fed_images_per_second"] / run["synthetic_images_per_second"] for run in r["runs"]]
        assert r["share"]["runs"] == pytest.approx(shares)
        assert r["loader_gpu_ms_per_batch"] is None and r["step_gpu_ms"] is None  # device times: CUDA only


def stop_in_run(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The ``n``-th run measured in this process (``run_contenders``) raises KeyboardInterrupt, as a
    Ctrl-C would once its loader is built; the others are measured."""
    measured = train.measure
    calls: list[int] = []

    def stopped(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return measured(*args, **kwargs)

    monkeypatch.setattr(train, "measure", stopped)

