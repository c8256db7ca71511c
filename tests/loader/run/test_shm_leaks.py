"""No file of ours stays in /dev/shm after a worker, or the main process, is killed.

torch names a shared-memory segment ``/dev/shm/torch_<pid>_<random>_<n>`` after the process that
made it. With the ``file_system`` sharing strategy (a common cure for "too many open files") the
name lives until every process that mapped it has let go, and a killed worker never does; the
batch pool's slots were such segments, made by the workers. Each load runs as its own process
with the strategy under test; what it leaves is found by those pids.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.terminal import ROOT

_LOAD = """
import faulthandler, gc, os, signal, sys, time
faulthandler.dump_traceback_later(150, exit=True)  # a hang shows every thread's stack, before the caller's timeout
import torch.multiprocessing
torch.multiprocessing.set_sharing_strategy(sys.argv[2])
from shardkit import LoaderError, ShardLoader, transforms

loader = ShardLoader(sys.argv[1], batch_size=4, transform=transforms.imagenet_train(32), num_workers=2)
pids = {os.getpid()}
for cycle in range(2):  # a clean close and re-iteration, then a kill
    batches = iter(loader)
    held = [next(batches) for _ in range(3)]
    workers = [w.pid for w in loader._supply.dataloader._iterator._workers]
    pids.update(workers)
    if cycle == 1:
        if sys.argv[3] == "main":
            print(" ".join(map(str, sorted(pids))), flush=True)
            time.sleep(60)  # killed here
        os.kill(workers[0], signal.SIGKILL)
        try:
            held += list(batches)
        except LoaderError:
            pass
    del held, batches
    loader.close()
del loader
gc.collect()
print(" ".join(map(str, sorted(pids))))
print(" ".join(n for n in sorted(os.listdir("/dev/shm")) if any(n.startswith(f"torch_{p}_") for p in pids)))
"""


def _ours(pids: list[int]) -> list[str]:
    return sorted(name for name in os.listdir("/dev/shm") if any(name.startswith(f"torch_{p}_") for p in pids))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_no_segment_left_after_a_worker_is_killed(packed: Path, strategy: str) -> None:
    done = subprocess.run([sys.executable, "-c", _LOAD, str(packed), strategy, "worker"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=200)
    assert done.returncode == 0, done.stderr
    pids, left = done.stdout.split("\n")[:2]
    assert len(pids.split()) == 5  # the main process and two workers per cycle
    assert left == ""  # while the main process still runs, after close() and garbage collection
    assert _ours([int(p) for p in pids.split()]) == []  # and after it exited


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_no_segment_or_process_left_after_the_main_process_is_killed(packed: Path, strategy: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _LOAD, str(packed), strategy, "main"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        pytest.fail(proc.stderr.read() if proc.stderr else "no output")
    pids = [int(p) for p in line.split()]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30  # workers notice their parent is gone within seconds (torch's watchdog)
    alive = [p for p in pids if p != proc.pid]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}") and "Z" not in _state(p)]
    assert alive == []
    deadline = time.monotonic() + 10  # torch's shm manager (file_system) unlinks what it registered when it exits
    while _ours(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours(pids) == []


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
