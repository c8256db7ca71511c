"""Feeder processes on a CUDA device: the CUDA IPC ring gives the in-process route's batches bit
for bit (images, and a tokenizer's ids), resume exact across feeder counts."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import ShardLoader, transforms
from shardkit.pack import PackOptions, pack_captions
from tests.loader.gpu_helpers import batches_on_cpu, make_packed_imagenet_like
from tests.trees import add_captions

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def inet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("inet_cuda"))


def test_feeders_deliver_the_in_process_batches_and_resume(inet: Path) -> None:
    """Feeder processes (CUDA IPC ring) give the batches of the route run in this process,
    bit for bit, in order, for 1 and 2 feeders; a state taken mid-epoch resumes exactly."""
    t = transforms.imagenet_train(96)
    local = batches_on_cpu(inet, "cuda", t, num_workers=3, feeders=0)
    for feeders in (1, 2):
        fed = batches_on_cpu(inet, "cuda", t, num_workers=3, feeders=feeders)
        assert [k for _, _, k in fed] == [k for _, _, k in local]
        for (x1, y1, _), (x2, y2, _) in zip(local, fed, strict=True):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    loader = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", keys=True, seed=7, num_workers=3,
                         feeders=2)
    assert loader.feeders == 2
    it = iter(loader)
    head = [next(it)[2] for _ in range(3)]
    state = loader.state_dict()
    kept = [(x.clone(), k) for x, _, k in (next(it) for _ in range(2))]  # batches outlive the ring's reuse
    del it
    loader.close()
    again = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", keys=True, seed=7, num_workers=2,
                        feeders=1)
    again.load_state_dict(state)
    rest = [k for _, _, k in again]
    again.close()
    assert head + rest == [k for _, _, k in local]
    assert [k for _, k in kept] == rest[:2]
    assert all(torch.equal(x, local[3 + i][0].cuda()) for i, (x, _) in enumerate(kept))


@pytest.fixture(scope="module")
def captioned(inet: Path) -> Path:
    """``inet``'s images (the odd ones too) captioned and packed as image-text pairs."""
    add_captions(inet.parent / "src")
    pack_captions(str(inet.parent / "src"), str(inet.parent / "captions"), options=PackOptions(max_count=16, seed=1),
                  workers=1)
    return inet.parent / "captions"


def test_feeders_carry_token_ids_as_the_in_process_route_delivers_them(captioned: Path) -> None:
    """A tokenizer padding to a fixed length: ``feeders="auto"`` runs feeders on the GPU route, and
    their batches (images and token ids, on the device) are the in-process route's bit for bit over
    2 epochs; a state taken mid-epoch resumes exactly in another feeder count."""
    kw: dict[str, Any] = {"batch_size": 16, "transform": transforms.imagenet_train(64), "device": "cuda", "keys": True,
                          "seed": 7, "text_transform": transforms.ByteTokenizer(24)}

    def epochs(loader: ShardLoader) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
        out = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for x, ids, k in loader:
                assert x.is_cuda and ids.is_cuda and ids.dtype == torch.int64 and ids.shape == (len(k), 24)
                out.append((x.cpu(), ids.cpu(), k))
        return out

    with ShardLoader(str(captioned), num_workers=3, feeders=0, **kw) as plain:
        local = epochs(plain)
    for feeders in ("auto", 2):
        with ShardLoader(str(captioned), num_workers=3, feeders=feeders, **kw) as fed:
            assert fed.feeders == (1 if feeders == "auto" else 2)
            got = epochs(fed)
        assert [k for _, _, k in got] == [k for _, _, k in local]
        for (x1, y1, _), (x2, y2, _) in zip(local, got, strict=True):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    with ShardLoader(str(captioned), num_workers=3, feeders=2, **kw) as loader:
        it = iter(loader)
        head = [next(it)[2] for _ in range(2)]
        state = loader.state_dict()
        kept = [(ids.clone(), k) for _, ids, k in (next(it) for _ in range(2))]  # batches outlive the ring's reuse
        del it
    with ShardLoader(str(captioned), num_workers=2, feeders=1, **kw) as again:
        again.load_state_dict(state)
        rest = [(ids.cpu(), k) for _, ids, k in again]
    first = [k for _, _, k in local[:len(head) + len(rest)]]
    assert head + [k for _, k in rest] == first
    assert all(torch.equal(ids.cpu(), local[2 + i][1]) for i, (ids, _) in enumerate(kept))
    assert all(torch.equal(ids, local[2 + i][1]) for i, (ids, _) in enumerate(rest))


def test_a_feeder_context_sleeps_in_its_waits() -> None:
    """sleep_while_waiting before the context exists: the context torch then creates has
    CU_CTX_SCHED_BLOCKING_SYNC (read back with cuCtxGetFlags), in a process of its own (this
    one's context exists already)."""
    import subprocess
    import sys

    script = ("import ctypes, torch\n"
              "from shardkit.loader.feed.cuda_sync import BLOCKING_SYNC, sleep_while_waiting\n"
              "assert sleep_while_waiting(0)\n"
              "torch.cuda.set_device(0); torch.zeros(1, device='cuda')\n"
              "flags = ctypes.c_uint()\n"
              "assert ctypes.CDLL('libcuda.so.1').cuCtxGetFlags(ctypes.byref(flags)) == 0\n"
              "print(flags.value & 0x07 == BLOCKING_SYNC)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_auto_feeders_take_over_on_cuda_and_the_staging_memory_goes(
        inet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """feeders="auto" on the GPU route: the first batch from this process, then the feeders
    (waited for mid-epoch), then the trial (short here, with a loop slower fed from this process)
    switching to this process and back; two epochs' batches are those of feeders=0 bit for bit,
    and once the feeders are kept the in-process route holds no pinned staging slot."""
    from shardkit.loader.feed import supply
    from shardkit.loader.feed.trial import DeviceStamp, PaceTrial

    monkeypatch.setattr(supply, "PaceTrial", functools.partial(PaceTrial, skip=1, window=2))
    t = transforms.imagenet_train(96)
    kw: dict[str, Any] = {"batch_size": 16, "transform": t, "device": "cuda", "keys": True, "seed": 7,
                          "num_workers": 2}
    local = []
    with ShardLoader(str(inet), feeders=0, **kw) as plain:
        for epoch in range(2):
            plain.set_epoch(epoch)
            local += [(x.cpu(), y.cpu(), k) for x, y, k in plain]
    with ShardLoader(str(inet), feeders="auto", **kw) as loader:
        assert loader.feeders == 1
        assert isinstance(loader._supply._stamp(), DeviceStamp)  # the trial times the loop on the device
        route: Any = loader.route
        got, places = [], []
        for epoch in range(2):
            loader.set_epoch(epoch)
            for x, y, k in loader:
                got.append((x.cpu(), y, k))
                places.append(loader._supply._side)
                if len(got) == 1:
                    assert route._slots  # the first batch came from this process's route
                    assert loader.wait_for_feeders(timeout=120)
                # far slower fed from this process, so the feeders win the trial on a loaded host too
                time.sleep(0.25 if loader._supply._side == "here" else 0.0)
        first_fed = places.index("feeders")
        assert "here" in places[first_fed:]  # back to this process for its phase of the trial
        assert loader._supply.trial.decided == "feeders" and set(loader._supply.trial.paces) == {"feeders", "here"}
        assert loader._supply.run is None and route._slots == []
    assert [k for _, _, k in got] == [k for _, _, k in local]
    for (x1, y1, _), (x2, y2, _) in zip(local, got, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2.cpu())


def test_the_trial_times_the_loop_on_the_devices_timeline() -> None:
    """A loop whose host runs ahead of its GPU work (nothing waits on the host): stamped by the
    host's clock its iterations take next to nothing, on the device's timeline they take what
    its kernel takes, which is what the trial must compare."""
    from shardkit.loader.feed.trial import DeviceStamp, PaceTrial

    device = torch.device("cuda")
    timed = []
    for _ in range(4):  # the first at whatever clock the idle GPU ran: not counted
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        timed.append(start.elapsed_time(end) / 1e3)
    kernel_s = sorted(timed[1:])[1]  # one "step" on the device, the median of three
    on_device, on_host = PaceTrial(skip=1, window=4), PaceTrial(skip=1, window=4)
    for n in range(40):
        for trial, now in ((on_device, DeviceStamp(device)), (on_host, time.monotonic())):
            trial.request(now, n, up=True)
            trial.fetching(n, trial.place(n), since_switch=n % 5, fresh=n % 5 == 0)
        torch.cuda._sleep(10_000_000)  # the step: queued, not waited for
    torch.cuda.synchronize()
    assert on_device.paces and on_host.paces
    for side, pace in on_device.paces.items():
        assert pace == pytest.approx(kernel_s, rel=0.2), (side, pace, kernel_s)
        assert on_host.paces[side] < 0.5 * kernel_s  # the host ran ahead
