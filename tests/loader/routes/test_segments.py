"""The routes' shared-memory segments have no name in /dev/shm, not even while they are made, and on
Linux its size does not bound them (a container's /dev/shm is often 64 MiB): a worker killed at any
moment leaves nothing there, and a loader needs no ``--shm-size``."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import reduce_storage

from shardkit import ShardLoader, transforms
from shardkit.loader.routes.device.payload import WorkerBuffers
from shardkit.loader.routes.gpu.worker import RawBatchBuilder
from shardkit.loader.routes.segments import in_segment, segment_view, share_, shared_segment
from shardkit.loader.run.stream import BatchStream, raise_failures
from shardkit.loader.run.workers import worker_loader
from tests.cli.terminal import ROOT
from tests.loader.gpu_helpers import make_packed_imagenet_like, staged

memfd = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux's")


def _backing_file(storage: torch.UntypedStorage) -> str:
    fd, _ = storage._share_fd_cpu_()
    return os.readlink(f"/proc/self/fd/{fd}")


@memfd
def test_a_segment_is_a_memfd_file_never_named_in_dev_shm() -> None:
    segment = shared_segment(4096)
    # torch's fd allocation is /dev/shm/torch_<pid>_..., named until it is mapped
    assert _backing_file(segment).startswith("/memfd:")
    assert not os.get_inheritable(segment._share_fd_cpu_()[0])  # a program this process starts keeps none
    view = segment_view(segment, (4, 1024))
    assert view.sum().item() == 0 and view.is_shared()
    assert shared_segment(0).nbytes() == 0


@memfd
def test_tensors_move_into_segments_in_place_with_their_layout() -> None:
    """What the feeders' ring and a worker's outgoing tensors go through (not torch's share_memory_)."""
    private = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4).contiguous(memory_format=torch.channels_last)
    expected, stride = private.clone(), private.stride()
    assert share_(private) is private and private.stride() == stride and torch.equal(private, expected)
    assert _backing_file(private.untyped_storage()).startswith("/memfd:")
    copy = in_segment(torch.ones(3, dtype=torch.float64).untyped_storage())
    assert _backing_file(copy).startswith("/memfd:") and in_segment(copy) is copy


@memfd
def test_a_device_routes_worker_buffer_ships_as_its_memfd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU routes' JPEG buffers travel by torch's own pickling: under the default
    ``file_descriptor`` strategy the receiving process maps the same memfd segment."""
    monkeypatch.setattr("shardkit.loader.routes.device.payload.get_worker_info", lambda: object())
    buffers = WorkerBuffers(cycle=2)
    blob = buffers.take(1 << 16)
    assert _backing_file(blob.untyped_storage()).startswith("/memfd:")
    if torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
        rebuild, args = reduce_storage(blob.untyped_storage())
        fd = args[1].detach()  # its descriptor, DupFd as multiprocessing sends it
        try:
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
        finally:
            os.close(fd)


_LOAD = """
import sys, shutil, torch
from shardkit import ShardLoader, transforms
free = shutil.disk_usage("/dev/shm").free
loader = ShardLoader(sys.argv[1], batch_size=32, transform=transforms.imagenet_train(256), num_workers=2)
seen = sum(len(labels) for _, labels in loader)
def views(image):  # a transform of the user's own: two float views, which the worker joins as default_collate does
    return {"a": image.float(), "b": torch.nn.functional.interpolate(image[None].float(), size=(256, 256))[0]}
other = ShardLoader(sys.argv[1], batch_size=32, transform=views, num_workers=2)
shapes = {tuple(images["b"].shape) for images, _ in other}
print(free >> 20, seen, sorted(shapes))
torch.multiprocessing.set_sharing_strategy("file_system")  # torch ships tensors through /dev/shm: no room
from shardkit import LoaderError
try:
    list(ShardLoader(sys.argv[1], batch_size=32, transform=views, num_workers=2))
except LoaderError as err:
    print("file_system:", "sharing strategy is file_system" in str(err) and "--shm-size" in str(err))
"""


@memfd
@pytest.mark.timeout(240)
def test_a_loader_runs_where_dev_shm_is_smaller_than_its_batches(packed: Path) -> None:
    """2 workers x up to 5 slots of 32 x 3 x 256 x 256 (6 MiB each) against a 4 MiB /dev/shm,
    mounted in a mount namespace of the loading process's own (root, or skip); then a transform
    of the user's own, whose float batches (24 MiB) torch would ship through /dev/shm."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (root) to give the load a small /dev/shm")
    script = f"mount -t tmpfs -o size=4m tmpfs /dev/shm && exec {sys.executable} -c \"$0\" \"$1\""
    done = subprocess.run([unshare, "-m", "sh", "-c", script, _LOAD, str(packed)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=200)
    if done.returncode != 0 and "mount:" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-2000:]
    # a 4 MiB /dev/shm; every sample of the dataset; batches of 32 and the last of 5, joined; under
    # the file_system strategy, an error that says why (not a loop waiting for a dropped batch)
    assert done.stdout.strip() == "4 69 [(5, 3, 256, 256), (32, 3, 256, 256)]\nfile_system: True"


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_the_gpu_routes_worker_half_sends_through_workers_what_it_builds_here(tmp_path: Path, strategy: str) -> None:
    """The GPU route's batches (JPEG bytes in a cycle of shared buffers per worker, reused) reach
    the training process as built, under either sharing strategy (no CUDA needed for this half)."""
    ds = make_packed_imagenet_like(tmp_path)
    transform = transforms.imagenet_train(64)
    loader = ShardLoader(str(ds), batch_size=8, transform=transform, num_workers=0, shuffle=True)

    def delivered(workers: int) -> list[tuple[list[str], list[bytes], bytes]]:
        builder = RawBatchBuilder(loader.reader, transform, buffer_cycle=4 if workers else 0)
        stream = BatchStream(loader.config, builder, torch.zeros(2, dtype=torch.int64).share_memory_())
        source = worker_loader(stream, num_workers=workers, prefetch=2, pin_memory=False) if workers else stream
        out = []
        for batch in raise_failures(source):
            raw = batch.images  # copied out of the shared buffer as the prefetcher copies it
            out.append((list(batch.keys), [bytes(t.numpy()) for t in staged(batch).jpegs()],
                        bytes(raw.blob.numpy()[raw.nbytes:])))
        return out

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        here, there = delivered(0), delivered(2)
    finally:
        torch.multiprocessing.set_sharing_strategy(before)
    assert len(here) == len(loader) and there == here


def _token_after_unpickling(data: bytes) -> str:
    return pickle.loads(data).token


def test_a_copy_of_the_receiving_loaders_buffers_receives_under_a_token_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader deep-copied or unpickled beside its original (mid-epoch) starts workers of its
    own, and dropped the mappings the original's workers had shipped to it: they shared a token,
    and the original's next batch named a buffer it no longer held. Its workers, and any other
    process, keep the token: they ship to the loader that sent them the builder."""
    import copy
    import multiprocessing

    buffers = WorkerBuffers(cycle=2)
    mine = buffers._received
    mine.segments[(buffers.token, 1, 0, 0)] = torch.UntypedStorage(8)  # a buffer a worker shipped
    for twin in (copy.deepcopy(buffers), pickle.loads(pickle.dumps(buffers))):
        assert twin.token != buffers.token
        twin.let_go()  # before its workers start
    assert list(mine.segments) == [(buffers.token, 1, 0, 0)]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_token_after_unpickling, (pickle.dumps(buffers),)) == buffers.token
    monkeypatch.setattr("shardkit.loader.routes.device.payload.get_worker_info", lambda: object())
    assert pickle.loads(pickle.dumps(buffers)).token == buffers.token  # in a worker
