"""The reliability experiments on process death while loading (R8): ``kill -9`` of a loader
worker, and of the training process itself, then resuming from its last checkpoint. Run by
``python -m benchmarks.reliability``, which writes the report.

The trainer is this module run as a script (``python -m benchmarks.reliability.death trainer DATASET
CHECKPOINT``): two epochs with two workers, the loader's ``state_dict()`` and the batches so far
checkpointed after every batch.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.reliability.report import Row, child_env, fmt_counts
from shardkit import LoaderError, ShardLoader, transforms

EPOCHS = 2


def _loader(ds: Path, workers: int) -> ShardLoader:
    return ShardLoader(str(ds), batch_size=4, transform=transforms.imagenet_train(32), seed=8, keys=True,
                       num_workers=workers, prefetch=2)


def _digest(batch: Any) -> list[Any]:
    images, labels, keys = batch
    return [list(keys), hashlib.sha256(images.contiguous().numpy().tobytes() + labels.numpy().tobytes()).hexdigest()]


def _ours(pids: set[int]) -> list[str]:
    """Files in /dev/shm that torch named after one of ``pids``."""
    return [n for n in os.listdir("/dev/shm") if any(n.startswith(f"torch_{p}_") for p in pids)]


def _worker_kills(ds: Path, trials: int, seed: int) -> tuple[collections.Counter[str], int, int, float]:
    """Kill a random worker at a random batch, half the time while the trainer is between batches.

    Returns the outcomes, how many times ``close()`` raised, /dev/shm files left (after close
    and garbage collection, strategies alternating) and the slowest kill-to-error time.
    """
    import torch.multiprocessing

    rng = random.Random(seed)
    outcomes: collections.Counter[str] = collections.Counter()
    close_raised = left = 0
    slowest = 0.0
    default = torch.multiprocessing.get_sharing_strategy()
    for trial in range(trials):
        torch.multiprocessing.set_sharing_strategy(default if trial % 2 == 0 else "file_system")
        loader = _loader(ds, 2)
        pids = {os.getpid()}
        at, between = rng.randrange(1, 2 * len(loader) - 2), rng.random() < 0.5
        killed_at = 0.0
        try:
            seen = 0
            for epoch in range(EPOCHS):
                loader.set_epoch(epoch)
                for _ in loader:
                    seen += 1
                    pids |= {w.pid for w in loader._supply.dataloader._iterator._workers}  # type: ignore[union-attr]
                    if seen == at:
                        workers = loader._supply.dataloader._iterator._workers  # type: ignore[union-attr]
                        worker = rng.randrange(len(workers))
                        os.kill(workers[worker].pid, signal.SIGKILL)
                        killed_at = time.monotonic()
                        if between:  # the training step
                            ends = time.monotonic() + 0.3
                            while time.monotonic() < ends:
                                sum(range(1000))
                            killed_at = time.monotonic()  # from here on, the next batch is asked for
            outcomes["finished (the worker had ended its share)"] += 1
        except LoaderError as err:
            named = "was killed by SIGKILL" in str(err) and "DataLoader worker" in str(err)
            outcomes["LoaderError naming the worker" if named else "LoaderError, worker not named"] += 1
            slowest = max(slowest, time.monotonic() - killed_at)
        except Exception as err:  # noqa: BLE001 - the point is to count these
            outcomes["FOREIGN " + type(err).__name__] += 1
        try:
            loader.close()
        except Exception:  # noqa: BLE001
            close_raised += 1
        del loader
        gc.collect()
        left += len(_ours(pids))
    torch.multiprocessing.set_sharing_strategy(default)
    return outcomes, close_raised, left, slowest


def _trainer(ds: str, checkpoint: str) -> None:
    """Train (read) EPOCHS epochs, resuming from ``checkpoint`` if it exists; after each batch
    write ``{"state", "batches", "pids"}`` to it atomically."""
    done: dict[str, Any] = {"state": None, "batches": [], "pids": []}
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            done = json.load(f)
    loader = _loader(Path(ds), 2)
    if done["state"] is not None:
        loader.load_state_dict(done["state"])
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            done["batches"].append(_digest(batch))
            done["state"] = loader.state_dict()
            done["pids"] = sorted({os.getpid(), *(w.pid for w in loader._supply.dataloader._iterator._workers)})  # type: ignore[union-attr]
            with open(checkpoint + ".tmp", "w") as f:
                json.dump(done, f)
            os.replace(checkpoint + ".tmp", checkpoint)
            time.sleep(0.02)  # the training step
    loader.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _trainer_kills(ds: Path, work: Path, trials: int, seed: int) -> tuple[int, int, int, int]:
    """Kill the trainer at a random batch, then run it again from its checkpoint.

    Returns how many resumed runs equal an uninterrupted one, how many were killed, worker
    processes alive 20 s after the kill and /dev/shm files left by the killed processes.
    """
    script = [sys.executable, "-m", "benchmarks.reliability.death", "trainer", str(ds)]
    env = child_env()
    reference = work / "r8-reference.json"
    subprocess.run([*script, str(reference)], env=env, check=True, timeout=300, capture_output=True)
    want = json.loads(reference.read_text())["batches"]
    rng = random.Random(seed)
    identical = killed = orphans = left = 0
    for trial in range(trials):
        checkpoint = work / f"r8-{trial}.json"
        proc = subprocess.Popen([*script, str(checkpoint)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        target = rng.randrange(1, len(want) - 1)
        deadline = time.monotonic() + 120
        seen: dict[str, Any] = {}
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                seen = json.loads(checkpoint.read_text())
            if len(seen.get("batches", [])) >= target:
                break
            time.sleep(0.005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait()
        pids = set(seen.get("pids", []))
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans += sum(_alive(p) for p in pids)
        left += len(_ours(pids))
        subprocess.run([*script, str(checkpoint)], env=env, check=True, timeout=300, capture_output=True)
        identical += json.loads(checkpoint.read_text())["batches"] == want
    return identical, killed, orphans, left


def r8_death(ds: Path, work: Path, worker_trials: int = 20, trainer_trials: int = 3, seed: int = 8) -> list[Row]:
    outcomes, close_raised, left, slowest = _worker_kills(ds, worker_trials, seed)
    identical, killed, orphans, trainer_left = _trainer_kills(ds, work, trainer_trials, seed)
    return [
        ("R8", "worker death (kill -9 of a loader worker)", f"{worker_trials} loads of 2 epochs, 2 workers, "
         f"SIGKILL of a random worker at a random batch (seed {seed}), half of them while the trainer is between "
         "batches (0.3 s of work); sharing strategy alternating file_descriptor / file_system",
         f"{fmt_counts(outcomes)}; close() raised {close_raised} times; slowest error after the kill (or after "
         f"the training step that followed it) {slowest:.2f} s; "
         f"files left in /dev/shm after close(): {left}",
         "every kill a LoaderError naming the worker, at the next batch; close() never raises; 0 files left"),
        ("R8", "trainer death (kill -9 of the training process)", f"{trainer_trials} runs of a trainer (2 epochs, "
         "2 workers, state_dict() checkpointed after every batch) killed at a random batch (seed "
         f"{seed}), then the same command, which resumes from the checkpoint", f"{killed} killed; {identical}/"
         f"{trainer_trials} resumed runs delivered the same batches as an uninterrupted run; worker processes "
         f"alive 20 s after the kill: {orphans}; files left in /dev/shm: {trainer_left}",
         "all identical; 0 processes; 0 files"),
    ]


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "trainer":
    _trainer(sys.argv[2], sys.argv[3])
