"""The loader's processes and threads carry names the OS shows (top, ps, /proc): its workers
``sk-worker<id>``, the device prefetcher's stages ``sk-fetch``/``sk-decode``/``sk-augment`` (CUDA
only), a feeder ``sk-feeder<part>``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import psutil
import pytest

from shardkit import ShardLoader, transforms
from shardkit.loader.threads import OS_NAME_LENGTH, name_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names through prctl: Linux")


def _comm(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/comm" if tid is None else f"/proc/{pid}/task/{tid}/comm"
    with open(path) as f:
        return f.read().strip()


def test_a_thread_takes_its_name_cut_to_what_the_os_keeps() -> None:
    got: list[str] = []

    def body() -> None:
        assert name_this_thread()  # its Python name
        got.append(_comm(psutil.Process().pid, threading.get_native_id()))
        assert name_this_thread("x" * 40)
        got.append(_comm(psutil.Process().pid, threading.get_native_id()))

    t = threading.Thread(target=body, name="sk-test")
    t.start()
    t.join()
    assert got == ["sk-test", "x" * OS_NAME_LENGTH]


def test_the_workers_are_named_for_the_os(packed: Path) -> None:
    with ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_train(32), num_workers=2) as loader:
        batches = iter(loader)
        next(batches), next(batches)  # batch i comes from worker i % 2: both have started
        names = {_comm(p.pid) for p in psutil.Process().children()}
    assert {"sk-worker0", "sk-worker1"} <= names


def test_a_feeder_and_its_workers_are_named_for_the_os(packed: Path) -> None:
    with ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_train(32), num_workers=1,
                     feeders=1) as loader:
        for _ in loader:  # through an epoch: its batches come from the feeder
            pass
        names = {_comm(p.pid) for p in psutil.Process().children(recursive=True)}
    assert {"sk-feeder0", "sk-worker0"} <= names
