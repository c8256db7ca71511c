"""A loader worker killed by SIGKILL (what the out-of-memory killer sends) ends the iteration
with a LoaderError naming the worker, the signal and the likely fix (issue 14)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from shardkit import LoaderError, ShardLoader, transforms


@pytest.mark.timeout(120)
def test_a_worker_killed_by_sigkill_is_named_with_cause_and_fix(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_val(32), shuffle=False,
                         num_workers=2, prefetch=1)
    batches = iter(loader)
    next(batches)
    worker = loader._dataloader._iterator._workers[0]  # type: ignore[union-attr]
    # torch's SIGCHLD handler raises its RuntimeError in whatever Python code runs when the signal
    # lands, here possibly this test's own frame: keep it off until the worker is dead (not
    # reaped), so that torch finds the dead worker from inside the loader's iteration instead.
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        os.kill(worker.pid, signal.SIGKILL)
        while os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    with pytest.raises(LoaderError) as info:
        for _ in batches:
            pass
    message = str(info.value)
    assert f"DataLoader worker 0 (pid {worker.pid}) was killed by SIGKILL" in message, message
    assert "out-of-memory" in message and "num_workers=2" in message and "prefetch=1" in message, message
    assert isinstance(info.value.__cause__, RuntimeError)  # torch's own error, kept
    assert str(worker.pid) in str(info.value.__cause__)
    loader.close()  # does not raise; a new iteration starts new workers
    assert sum(1 for _ in loader) == len(loader)
    loader.close()
