"""feeders="auto" once its feeders are up: the loop is timed fed by them, then fed from this
process, and the faster side stays, with the batches of a loader without feeders throughout. A
loader on the CPU whose loop is made slower on one side (PaceTrial on its own:
test_pace_trial.py)."""

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
from tests.ports import free_port
from tests.ranks import gloo, write_gathered

pytestmark = pytest.mark.timeout(240)


class _Clock:
    """The time the trial reads (``Supply._stamp``): moved on only by :func:`_train`'s steps, so
    which side was faster never depends on the machine's load (the tests run beside others)."""

    now = 0.0


def _auto(monkeypatch: pytest.MonkeyPatch, clock: _Clock | None = None) -> list[tuple[str, int, int]]:
    """feeders="auto" choosing one feeder on the CPU, with a short trial (1 batch skipped and 4
    timed on each side), timed by ``clock`` where given; the returned list gets (side, epoch,
    batch) of every delivery the loader opens while it has not settled."""
    from shardkit.loader import loader as loader_module
    from shardkit.loader.feed import supply

    if clock is not None:
        monkeypatch.setattr(supply.Supply, "_stamp", lambda self: clock.now)

    monkeypatch.setattr(loader_module, "feeder_count", lambda *args, **kwargs: (1, SlotLabels()))
    monkeypatch.setattr(supply, "PaceTrial", functools.partial(PaceTrial, skip=1, window=4))
    opens: list[tuple[str, int, int]] = []
    real = supply.Supply._open

    def record(self: Any, place: Any, pool: Any, epoch: int, at: int, *args: Any) -> Any:
        opens.append((place, epoch, at))
        return real(self, place, pool, epoch, at, *args)

    monkeypatch.setattr(supply.Supply, "_open", record)
    return opens


def _train(loader: Any, slower: str, clock: _Clock, epochs: int = 3, on_batch: Any = None) -> list[Any]:
    """``epochs`` epochs of a loop whose step takes 50 ms on ``clock`` when fed from ``slower``
    (``"feeders"`` or ``"here"``), else 10 ms (and 10 ms of real time either way); the batches.
    ``on_batch(loader, n)`` after the n-th."""
    got = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            got.append(batch)
            if on_batch is not None:
                on_batch(loader, len(got))
            place = loader._supply._side if loader._supply.pool is not None else "here"  # the batch's side
            clock.now += 0.05 if place == slower else 0.01
            time.sleep(0.01)
    return got


@pytest.mark.parametrize("slower", ["feeders", "here"])
def test_the_loader_keeps_the_side_that_fed_the_loop_faster_with_the_same_batches(
        packed: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, slower: str) -> None:
    """Both ways: the loop slower fed by the feeders keeps the route here (the feeders stopped,
    ``feeders`` 0); slower fed from here keeps the feeders (this process's workers stopped). The
    batches, labels and pixels are those of feeders=0 across the switches and epochs."""
    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=3)
        assert plain.trial is None and plain.settled
    opens = _auto(monkeypatch, clock := _Clock())
    kept = "here" if slower == "feeders" else "feeders"
    with _loader(packed) as loader, caplog.at_level(logging.INFO, logger="shardkit.loader"):
        assert not loader.settled and loader.trial is not None and loader.trial.paces == {}
        loader.wait_for_feeders()  # started now: the trial begins at the first batch
        got = _train(loader, slower, clock)
        # phases of 5 batches, 9 batches an epoch: the feeders 0-4 (4 timed after the first),
        # here 5-8 and the first of the next epoch (2 timed: not 5, the first after the switch,
        # nor 8, the last before the epoch's end, nor 9, the first of an epoch); the side kept
        # from the 11th batch (epoch 1, batch 1)
        assert opens == [("feeders", 0, 0), ("here", 0, 5), ("here", 1, 0)] + (
            [("feeders", 1, 1)] if kept == "feeders" else [])
        assert loader.trial is not None and loader.trial.decided == kept and loader.settled
        paces = loader.trial.paces  # the loop's step on the trial's clock: 50 ms on the slower side, 10 ms on the other
        assert paces[slower] == pytest.approx(0.05) and paces[kept] == pytest.approx(0.01), paces
        if kept == "here":
            assert loader.feeders == 0 and loader._supply.pool is None and loader._supply.run is not None
        else:
            assert loader.feeders == 1 and loader._supply.pool is not None and loader._supply.run is None
    _same(want, got)
    [line] = [r.getMessage() for r in caplog.records if "feeders='auto'" in r.getMessage()]
    assert ("keeps its 1 feeder processes" if kept == "feeders" else "runs the route in this process") in line


def test_after_the_trial_keeps_the_route_here_the_workers_read_ahead_from_the_epoch_it_ended_in(
        packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial decides in epoch 1 (as above) for this process: the delivery that ends epoch 1
    goes on into epoch 2 (read-ahead), as a loader with feeders=0 does from its first epoch,
    instead of epoch 2 waiting for its workers to start it; the batches stay those of feeders=0."""
    from shardkit.loader.run import epoch_run

    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=3)
    _auto(monkeypatch, clock := _Clock())
    taken_over: list[int] = []
    real = epoch_run._TakenOver.__init__

    def spy(self: Any, delivery: Any) -> None:
        taken_over.append(len(got))
        real(self, delivery)

    monkeypatch.setattr(epoch_run._TakenOver, "__init__", spy)
    got: list[Any] = []
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        got += _train(loader, "feeders", clock, epochs=2)
        assert loader.trial is not None and loader.trial.decided == "here" and loader._supply.pool is None
        run = loader._supply.run
        assert run is not None and run._kept is not None and run._kept[0] == 2  # epoch 1's delivery, kept
        got += _epoch(loader, 2)
        assert taken_over == [18]  # epoch 2 (from the 19th batch) taken over from epoch 1's delivery
    _same(want, got)


def test_a_loader_pickles_during_and_after_the_trial(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed loader with feeders="auto" pickles (as one with feeders=0 does; a live one too:
    test_feeders.py) mid-trial (an epoch left early, the phase's intervals not carried) and once the trial
    kept the route here (its delivery kept for read-ahead not carried); each copy gives the
    next epoch's batches."""
    import pickle

    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=3)
    _auto(monkeypatch, clock := _Clock())
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        loader.set_epoch(0)
        for i, _ in enumerate(loader):
            if i == 6:
                break  # in the trial's second phase
        assert loader.trial is not None and loader.trial.decided is None and loader._supply._auto_delivery is not None
        loader.close()
        mid = pickle.loads(pickle.dumps(loader))
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        _train(loader, "feeders", clock, epochs=2)
        run = loader._supply.run
        assert loader.trial is not None and loader.trial.decided == "here" and run is not None and run._kept is not None
        loader.close()
        after = pickle.loads(pickle.dumps(loader))
    with mid, after:
        _same(want[9:18], _epoch(mid, 1))
        _same(want[18:], _epoch(after, 2))


def _epoch(loader: Any, epoch: int) -> list[Any]:
    loader.set_epoch(epoch)
    return list(loader)


@pytest.mark.parametrize("slower", ["feeders", "here"])
def test_the_trial_after_a_start_behind_the_first_batches_reuses_this_processs_workers(
        packed: Path, monkeypatch: pytest.MonkeyPatch, slower: str) -> None:
    """Feeders that come up mid-epoch (after 3 batches from here): the workers of this process
    stay up while the feeders deliver, the trial switches back to them, and the batches are
    those of feeders=0 throughout."""
    from shardkit.loader.run.workers import workers_running
    from tests.loader.feed.test_feeder_start import _gated

    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=3)
    opens = _auto(monkeypatch, clock := _Clock())
    gate, _ = _gated(monkeypatch)
    kept = "here" if slower == "feeders" else "feeders"
    feeding: list[Any] = []

    def on_batch(loader: Any, n: int) -> None:
        if n == 3:
            gate.set()
            assert loader.wait_for_feeders(timeout=120)
        supply = loader._supply
        if supply.pool is not None and supply._side == "feeders" and supply.trial.decided is None:
            feeding.append(supply.dataloader is not None and workers_running(supply.dataloader))

    with _loader(packed) as loader:
        got = _train(loader, slower, clock, on_batch=on_batch)
        # here while they start (0-2), the feeders for the rest of phase 0 (3-4, not timed: they
        # came up mid-phase), here for phase 1 (5-9, timed), the feeders for phase 2 (10-14,
        # timed), then the side kept
        assert opens == [("here", 0, 0), ("feeders", 0, 3), ("here", 0, 5), ("here", 1, 0), ("feeders", 1, 1)] + (
            [("here", 1, 6)] if kept == "here" else [])
        assert loader._supply.trial.decided == kept
        assert feeding and all(feeding)  # this process's workers up while the feeders delivered
    _same(want, got)


def test_feeders_kept_by_the_trial_and_closed_start_again_behind_the_first_batches(
        packed: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """After the trial kept the feeders, close(): the next epoch's first batches come from this
    process while they start again; where they cannot, the route stays here, with one warning,
    and every batch comes."""
    from shardkit.loader.feed import pool as feeders

    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=3)
    _auto(monkeypatch, clock := _Clock())
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        got = _train(loader, "here", clock, epochs=2)
        assert loader._supply.trial.decided == "feeders" and loader.settled
        loader.close()
        assert not loader.settled
        monkeypatch.setattr(feeders.FeederPool, "launch", lambda self: (_ for _ in ()).throw(
            feeders.LoaderError("no feeders today")))
        with caplog.at_level(logging.WARNING, logger="shardkit.loader"):
            got += _train(loader, "here", clock, epochs=3)[18:]  # the third epoch
        assert loader.feeders == 0 and loader._supply.pool is None and loader.trial is None and loader.settled
    _same(want, got)
    assert caplog.text.count("no feeders today") == 1


def test_feeders_made_anew_for_a_new_layout_stop_the_ones_started(packed: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """A loader laid out again before its first epoch (built before the process group) whose
    feeders wait_for_feeders() already started: those stop before new ones are made."""
    _auto(monkeypatch)
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        old = loader._supply.pool
        assert old is not None and old.running
        processes = [h.process for h in old._handles]
        loader._supply.relayout()
        assert not old.running and not any(p.is_alive() for p in processes)
        assert loader._supply.pool is not old and loader.trial is not None and loader.trial.paces == {}


def test_a_loop_taking_one_batch_per_iteration_settles_with_the_feeders(packed: Path, monkeypatch: pytest.MonkeyPatch
                                                                        ) -> None:
    """``next(iter(loader))`` at each step (every batch an iteration's first, no interval to
    time): the feeders are launched from the loader's second batch, and PHASES timed phases
    after they are up the trial ends keeping them."""
    from tests.loader.feed.test_feeder_start import _server_ready

    _auto(monkeypatch)
    _server_ready()  # launched at the second batch, not after READY_WAIT_S
    with _loader(packed) as loader:
        trial, supply = loader.trial, loader._supply
        assert trial is not None and supply.pool is not None
        up_at, deadline = None, time.monotonic() + 120
        while not loader.settled and time.monotonic() < deadline:
            next(iter(loader))
            if up_at is None and supply.pool is not None and supply.pool.running:
                up_at = supply.served
        assert loader.settled and trial.decided == "feeders" and trial.paces == {} and loader.feeders == 1
        assert up_at is not None and supply.served - up_at <= (trial.phases + 2) * trial.length


def test_a_resume_point_taken_during_the_trial_is_exact(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """state_dict() while the trial has the route here resumes to exactly the batches not yet
    delivered."""
    with _loader(packed, feeders=0) as plain:
        want = [k for _, _, k in plain]
    _auto(monkeypatch)
    with _loader(packed) as loader:
        loader.wait_for_feeders()
        it = iter(loader)
        first = [next(it)[2] for _ in range(8)]  # the 6th to the 8th from here
        assert loader._supply._side == "here" and loader._supply.trial.decided is None
        state = loader.state_dict()
    with _loader(packed, feeders=0) as resumed:
        resumed.load_state_dict(state)
        rest = [k for _, _, k in resumed]
    assert first + rest == want


def _ddp_rank(rank: int, world: int, port: int, dataset: str, out: str) -> None:
    """A rank of test_ddp_ranks_switch_together: feeders="auto" with one feeder and a short
    trial; rank 1 starts its feeders before the first batch, rank 0 behind its first batches."""

    import torch
    import torch.distributed as dist

    from shardkit.loader import loader as loader_module
    from shardkit.loader.feed import supply

    loader_module.feeder_count = lambda *args, **kwargs: (1, SlotLabels())
    supply.PaceTrial = functools.partial(PaceTrial, skip=1, window=4)  # type: ignore[misc,assignment]
    with gloo(rank, world, port):
        got: dict[str, list[Any]] = {"keys": [], "plain": [], "sides": [], "up": [], "open": []}
        with _loader(Path(dataset), num_workers=1) as plain:
            for epoch in range(4):
                plain.set_epoch(epoch)
                got["plain"] += [k for _, _, ks in plain for k in ks]
        with _loader(Path(dataset), num_workers=1) as loader:
            if rank == 1:
                loader.wait_for_feeders()
            for epoch in range(4):
                loader.set_epoch(epoch)
                for _, _, keys in loader:
                    got["keys"].append(keys)
                    sup = loader._supply
                    got["sides"].append(sup._side if sup.pool is not None else "here")
                    got["up"].append(sup.pool is not None and sup.pool.running)
                    got["open"].append(sup.trial.decided is None)
                    dist.all_reduce(torch.ones(1))  # the ranks step together, as under DDP
                    time.sleep(0.01)
        write_gathered(out, got)


def test_ddp_ranks_switch_together(packed: Path, tmp_path: Path) -> None:
    """Two real gloo ranks whose feeders come up at different batches: from the batch both are
    up until the first decides, every batch of both comes from the same side (with phases
    counted from each rank's own start, the ranks' sides differed there when one came up
    mid-phase); each rank gets the batches of feeders=0."""
    import json

    import torch.multiprocessing as mp


    out = tmp_path / "ranks.json"
    mp.start_processes(_ddp_rank, args=(2, free_port(), str(packed), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    ranks = json.loads(out.read_text())
    for r in ranks:
        assert [k for keys in r["keys"] for k in keys] == r["plain"]
    both = max(r["up"].index(True) for r in ranks) + 1  # the first batch both fetched with them up
    until = min(r["open"].index(False) if False in r["open"] else len(r["open"]) for r in ranks)
    assert both < until, (both, until)
    assert ranks[0]["sides"][both:until] == ranks[1]["sides"][both:until]


def test_the_trial_times_a_loader_on_the_cpu_by_the_hosts_clock(packed: Path) -> None:
    with _loader(packed, feeders=0) as loader:
        before, stamp = time.monotonic(), loader._supply._stamp()
        assert isinstance(stamp, float) and before <= stamp <= time.monotonic()
