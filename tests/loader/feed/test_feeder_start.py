"""feeders="auto" on the CPU: the first batches come from the training process while the feeders
start, and the feeders take over with the same batches (at a chosen batch, between epochs, never;
what the trial that follows keeps: test_feeder_trial.py);
a resume point from before the hand-over, close() and script exit while they start, a start
that does not come in time, and wait_for_feeders(). The shared helpers are test_feeders.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from shardkit.loader.feed.labels import SlotLabels
from tests.loader.feed.test_feeders import _epochs, _loader, _same

pytestmark = pytest.mark.timeout(240)


def _server_ready() -> None:
    """Wait until the feeders' forkserver (started by the first loader with feeders) has imported
    its preload: from then on a loader launches its feeders at the second batch."""
    from shardkit.loader.feed import pool
    from shardkit.loader.feed.ready import ready

    pool._context()
    deadline = time.monotonic() + 120
    while not ready():
        assert time.monotonic() < deadline, "the feeders' forkserver did not get ready in 120 s"
        time.sleep(0.05)


def _gated(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[tuple[int, int]]]:
    """feeders="auto" choosing one feeder on the CPU; the loader sees its feeders as started only
    once the returned event is set (they start for real meanwhile); the (epoch, start) of every
    epoch the pool is asked for are recorded in the returned list."""
    import threading

    from shardkit.loader import loader as loader_module
    from shardkit.loader.feed import pool as feeders

    monkeypatch.setattr(loader_module, "feeder_count", lambda *args, **kwargs: (1, SlotLabels()))
    gate, asked = threading.Event(), list[tuple[int, int]]()
    real_poll, real_epoch = feeders.FeederPool.poll_started, feeders.FeederPool.epoch
    monkeypatch.setattr(feeders.FeederPool, "poll_started", lambda self: real_poll(self) and gate.is_set())

    def epoch(self: feeders.FeederPool, epoch: int, start: int, *args: Any) -> Any:
        asked.append((epoch, start))
        return real_epoch(self, epoch, start, *args)

    monkeypatch.setattr(feeders.FeederPool, "epoch", epoch)
    _server_ready()
    return gate, asked


def test_auto_feeders_take_over_mid_epoch_with_the_same_batches(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With feeders="auto" the first batches come from the route in this process while the
    feeders start; they take the epoch over at the first batch after they are up, and the loop
    gets the batches, labels and pixels of a loader without feeders."""
    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain)
    gate, asked = _gated(monkeypatch)
    with _loader(packed) as loader:
        got = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for x, y, k in loader:
                got.append((x, y, k))
                if len(got) == 3:
                    assert loader._supply.run is not None and loader._supply.pool is not None
                    assert loader._supply.pool.launched or loader._supply.pool.running  # launched at the second batch
                    gate.set()
                    assert loader.wait_for_feeders(timeout=120)
        assert asked == [(0, 3), (1, 0)]  # epoch 0 from batch 3 on, epoch 1 whole
        assert loader._supply._side == "feeders" and loader._supply.trial.decided is None  # still timing them
    _same(want, got)


def test_feeders_up_between_epochs_take_the_next_one(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Feeders that come up after an epoch ran whole in this process deliver the next one (the
    trial of test_feeder_trial.py times them first)."""
    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain)
    gate, asked = _gated(monkeypatch)
    with _loader(packed) as loader:
        loader.set_epoch(0)
        got = list(loader)
        assert loader._supply.dataloader is not None and asked == []
        gate.set()
        assert loader.wait_for_feeders(timeout=120)
        loader.set_epoch(1)
        got += list(loader)
        assert asked == [(1, 0)] and loader._supply._side == "feeders"
    _same(want, got)


def test_a_resume_point_taken_while_the_feeders_start_is_exact(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """state_dict() after batches made in this process, before the feeders took over, resumes to
    exactly the batches not yet delivered."""
    with _loader(packed, feeders=0) as plain:
        want = [k for _, _, k in plain]
    _gated(monkeypatch)  # never opened: the feeders never take over
    with _loader(packed) as loader:
        it = iter(loader)
        first = [next(it)[2] for _ in range(3)]
        assert loader._supply.run is not None
        state = loader.state_dict()
    with _loader(packed, feeders=0) as resumed:
        resumed.load_state_dict(state)
        rest = [k for _, _, k in resumed]
    assert first + rest == want


def _slow_feeders(monkeypatch: pytest.MonkeyPatch) -> None:
    """feeders="auto" choosing one feeder on the CPU, whose process starts only after
    ``slow_feeder.DELAY_S`` seconds."""
    from shardkit.loader import loader as loader_module
    from shardkit.loader.feed import handle
    from tests.loader.feed.slow_feeder import slow_feeder_main

    monkeypatch.setattr(loader_module, "feeder_count", lambda *args, **kwargs: (1, SlotLabels()))
    monkeypatch.setattr(handle, "feeder_main", slow_feeder_main)
    _server_ready()


def test_the_first_batches_do_not_wait_for_the_feeders(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Feeders that take seconds to start: the batches of the first epoch keep coming from this
    process meanwhile (launched, not started), then the feeders take over with the same batches."""
    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain)
    _slow_feeders(monkeypatch)
    with _loader(packed) as loader:
        loader.set_epoch(0)
        got = [(x, y, k) for x, y, k in loader]
        # the whole epoch came while the feeder slept (10 s) after its launch at the second batch
        assert loader._supply.pool is not None and loader._supply.pool.launched and not loader._supply.pool.running
        assert loader.wait_for_feeders(timeout=120)
        loader.set_epoch(1)
        got += [(x, y, k) for x, y, k in loader]
        assert loader._supply._side == "feeders" and loader._supply.pool.running
    _same(want, got)


def test_closing_while_the_feeders_start_stops_them(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader closed after its feeders were launched, before they started, stops them."""
    _slow_feeders(monkeypatch)
    loader = _loader(packed)
    it = iter(loader)
    next(it)
    next(it)  # the feeders are launched before the second batch
    pool = loader._supply.pool
    assert pool is not None and pool.launched and not pool.running and pool._launched is not None
    processes = [h.process for h in pool._launched[0]]
    loader.close()
    assert processes and not any(p.is_alive() for p in processes)
    assert not pool.launched and not pool.running


def test_feeders_that_do_not_start_in_time_leave_the_route_here(
        packed: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A feeder that has not started within START_TIMEOUT_S is given up (one warning): the route
    stays in this process and every batch comes."""
    from shardkit.loader.feed import pool as feeders

    with _loader(packed, feeders=0) as plain:
        want = [k for _, _, k in plain]
    _slow_feeders(monkeypatch)
    monkeypatch.setattr(feeders, "START_TIMEOUT_S", 0.5)
    with _loader(packed) as loader, caplog.at_level("WARNING", logger="shardkit.loader"):
        got = []
        for _, _, k in loader:
            got.append(k)
            time.sleep(0.15)
        assert got == want and loader.feeders == 0 and loader._supply.pool is None
    assert caplog.text.count("did not start within 0 s") == 1


def test_wait_for_feeders_before_the_first_epoch(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_for_feeders() before the first iteration starts the feeders at once: every batch
    then comes from them."""
    with _loader(packed, feeders=0) as plain:
        want = [k for _, _, k in plain]
    gate, asked = _gated(monkeypatch)
    gate.set()
    with _loader(packed) as loader:
        assert loader.wait_for_feeders()
        got = []
        for _, _, k in loader:
            got.append(k)
            assert loader._supply.run is None
        assert got == want and asked == [(0, 0)]


@pytest.mark.parametrize("close", [True, False])
def test_a_script_that_ends_while_its_feeders_start_exits_cleanly(packed: Path, tmp_path: Path, close: bool) -> None:
    """A script that takes two batches (its feeders are launched at the second) and ends, closing
    its loader or not, before they started: exit status 0 and no traceback."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import shardkit.loader.loader as loader_module
        from shardkit.loader.feed.labels import SlotLabels
        from shardkit.loader.feed.ready import ready
        from shardkit import ShardLoader, transforms
        loader_module.feeder_count = lambda *args, **kwargs: (1, SlotLabels())  # "auto" on the CPU: one
        loader = ShardLoader({str(packed)!r}, batch_size=8, transform=transforms.imagenet_val(32), num_workers=2)
        while not ready():  # launched at the second batch once the forkserver has imported torch
            time.sleep(0.05)
        it = iter(loader)
        next(it)
        next(it)
        assert loader._supply.pool.launched or loader._supply.pool.running
        if {close!r}:
            loader.close()
        print("done", flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


def test_no_batch_waits_for_the_forkserver_to_import_torch(packed: Path, tmp_path: Path) -> None:
    """The feeders are launched only once their forkserver has imported its whole preload: with
    the server held at an import after shardkit's own modules (a gate file; the batches are taken
    once it is held there), batches keep coming from this process and nothing is launched, also
    through wait_for_feeders(timeout); once it is released the feeders start and deliver the rest,
    every sample once. In a process of its own: the forkserver is one per process."""
    gate = tmp_path / "gate"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os
        import time
        import shardkit.loader.loader as loader_module
        from shardkit.loader.feed import pool
        from shardkit.loader.feed.labels import SlotLabels
        from shardkit import ShardLoader, transforms
        loader_module.feeder_count = lambda *args, **kwargs: (1, SlotLabels())  # "auto" on the CPU: one
        pool.PRELOAD = (*pool.PRELOAD, "tests.loader.feed.gated_import")  # the server waits for the gate
        pool.READY_WAIT_S = 600.0  # a slow machine's server must not be launched at anyway meanwhile
        loader = ShardLoader({str(packed)!r}, batch_size=4, transform=transforms.imagenet_val(32), num_workers=2,
                             keys=True)
        deadline = time.monotonic() + 60
        while not os.path.exists({str(gate)!r} + ".reached"):  # the server imported shardkit and is held
            assert time.monotonic() < deadline, "the forkserver never reached the gate"
            time.sleep(0.05)
        it = iter(loader)
        keys = [k for _ in range(6) for k in next(it)[2]]
        pool = loader._supply.pool
        assert not pool.launched and not pool.running, "launched before the server was ready"
        t0 = time.monotonic()
        assert not loader.wait_for_feeders(timeout=1.0), "started although the server is held"
        assert time.monotonic() - t0 < 10, "wait_for_feeders(timeout=1.0) blocked"
        open({str(gate)!r}, "w").close()
        assert loader.wait_for_feeders(timeout=60)
        keys += [k for _, _, ks in it for k in ks]
        assert loader._supply.pool.running and loader._supply._side == "feeders", "the feeders did not take over"
        assert len(keys) == len(set(keys)) == 69, len(keys)  # every sample once
        loader.close()
        print("done", flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "SHARDKIT_TEST_GATE": str(gate)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr


@pytest.mark.parametrize("parent", [True, False])
def test_the_marker_is_written_only_for_the_process_that_named_it(tmp_path: Path, parent: bool) -> None:
    """shardkit._forkserver_ready creates the file only in a process whose parent's pid is in its
    name (the forkserver of the process that started it), and drops the variable either way."""
    pid = os.getpid() if parent else os.getpid() + 1_000_000
    path = tmp_path / f"shardkit-forkserver-{pid}-abc"
    script = "import os, shardkit._forkserver_ready; print('SHARDKIT_FORKSERVER_READY' in os.environ)"
    env = {**os.environ, "SHARDKIT_FORKSERVER_READY": str(path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    assert path.exists() == parent


def test_the_forkserver_preload_ends_with_the_marker() -> None:
    """preloading_forkserver puts the given modules last, in order, after what the program asked
    for (the marker last of all); in a process of its own, where no server runs yet."""
    script = textwrap.dedent("""
        import multiprocessing
        from multiprocessing import forkserver
        multiprocessing.set_forkserver_preload(["json", "shardkit._forkserver_ready"])
        from shardkit.loader.feed import pool, ready
        pool._context()
        print(forkserver._forkserver._preload_modules)
        while not ready.ready():
            pass
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(["json", "shardkit.loader.feed.process", "shardkit._forkserver_ready"])
