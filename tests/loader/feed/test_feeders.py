"""Feeder processes (``ShardLoader(feeders=N)``) on the CPU: the batches of the loader without them,
exact and elastic resume, errors with their names, a dead feeder named, nothing left running,
and a training script without a main guard. The CUDA hand-off (IPC ring, events) is tested in
``test_gpu_cuda.py``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from sample_data.generate import make_indexed_imagefolder
from shardkit import LoaderError, ShardLoader, transforms
from shardkit.codec import libjpeg
from shardkit.loader.feed.labels import SlotLabels
from shardkit.loader.feed.layout import auto_feeders, feeder_of, feeder_workers
from shardkit.pack import PackOptions, pack
from shardkit.transforms.random_resized_crop import RandomResizedCropFlip
from tests.loader.read.test_bad_samples import _garble_middle
from tests.loader.read.test_decode_warnings import _with_stray_bytes

pytestmark = pytest.mark.timeout(240)

T = transforms.imagenet_train(32)


def _loader(ds: Path, **kw: Any) -> ShardLoader:
    args: dict[str, Any] = {"batch_size": 8, "transform": T, "keys": True, "seed": 5, "num_workers": 2} | kw
    return ShardLoader(str(ds), **args)


def _epochs(loader: ShardLoader, epochs: int = 2, stop_after: int | None = None
            ) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for i, (x, y, k) in enumerate(loader):
            out.append((x, y, k))
            if stop_after is not None and i + 1 == stop_after and epoch == 0:
                break  # an iteration left early: the loader starts the next epoch next time
    return out


def _same(a: list[tuple[torch.Tensor, torch.Tensor, list[str]]],
          b: list[tuple[torch.Tensor, torch.Tensor, list[str]]]) -> None:
    assert [k for _, _, k in a] == [k for _, _, k in b]
    for (x1, y1, _), (x2, y2, _) in zip(a, b, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_layout_helpers() -> None:
    assert [feeder_workers(p, 3, 7) for p in range(3)] == [3, 2, 2]
    # batch i comes from worker i % W, which runs in feeder (i % W) % P
    assert [feeder_of(i, num_workers=3, parts=2) for i in range(7)] == [0, 1, 0, 0, 1, 0, 0]
    assert auto_feeders(0) == 0 and auto_feeders(4) == 1 and auto_feeders(100) == 4


@pytest.mark.parametrize(("feeders", "workers", "drop_last"), [(1, 1, True), (2, 3, False), (3, 4, False)])
def test_feeders_deliver_the_batches_of_the_loader_without_them(packed: Path, feeders: int, workers: int,
                                                                 drop_last: bool) -> None:
    """Two epochs, the first left after 3 batches (so the next iteration runs epoch 1 anew), with
    a short last batch where drop_last is off: same keys, labels and pixels, same stats counts."""
    with _loader(packed, num_workers=workers, drop_last=drop_last, feeders=0) as plain:
        want = _epochs(plain, stop_after=3)
    with _loader(packed, num_workers=workers, drop_last=drop_last, feeders=feeders) as fed:
        assert fed.feeders == feeders
        got = _epochs(fed, stop_after=3)
        stats = fed.stats
        assert stats.batches == len(got) and stats.samples == sum(len(k) for _, _, k in got)
        assert stats.elapsed_s > 0 and stats.decode_s > 0  # this process's times, the feeders' counters
    _same(want, got)


def test_feeders_resume_exactly_and_elastically(packed: Path) -> None:
    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=1)
    with _loader(packed, feeders=2) as fed:
        it = iter(fed)
        head = [next(it) for _ in range(3)]
        state = fed.state_dict()
        del it
    with _loader(packed, num_workers=3, feeders=1) as again:  # another worker and feeder count
        again.load_state_dict(state)
        rest = list(again)
    _same(want, head + rest)
    # elastic: another batch size resumes with the samples not yet delivered, as without feeders
    elastic = {}
    for feeders in (0, 2):
        with _loader(packed, batch_size=5, feeders=feeders) as loader:
            loader.load_state_dict(state)
            elastic[feeders] = list(loader)
    _same(elastic[0], elastic[2])
    seen = {k for _, _, ks in head for k in ks} | {k for _, _, ks in elastic[2] for k in ks}
    assert len(seen) == len({k for _, _, ks in want for k in ks})


def test_a_bad_sample_reaches_the_caller_with_its_name(packed: Path, tmp_path: Path) -> None:
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    key = _garble_middle(ds)
    with (_loader(ds, on_error="raise", shuffle=False, feeders=2) as loader,
          pytest.raises(LoaderError, match="bad sample") as err):
        list(loader)
    assert key in str(err.value)
    counts = {}
    for feeders in (0, 2):  # "replace": replaced and counted as without feeders
        with _loader(ds, shuffle=False, feeders=feeders) as loader:
            keys = [k for _, _, ks in loader for k in ks]
            counts[feeders] = (keys, loader.stats.replaced)
    assert counts[0] == counts[2] and counts[2][1] >= 1 and key not in counts[2][0]


def test_a_killed_feeder_is_named_and_close_does_not_hang(packed: Path) -> None:
    # batches of 2: more than a feeder's ring holds, so the killed one cannot have sent them all
    loader = _loader(packed, feeders=2, prefetch=1, batch_size=2)
    it = iter(loader)
    next(it)
    assert loader._supply.pool is not None
    pid = loader._supply.pool.pids[1]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(LoaderError, match=rf"feeder process 1 \(pid {pid}\) was killed by SIGKILL"):
        for _ in it:
            pass
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 30


def test_close_stops_the_feeders_and_their_workers(packed: Path) -> None:
    loader = _loader(packed, feeders=2)
    next(iter(loader))
    assert loader._supply.pool is not None
    pids = loader._supply.pool.pids
    loader.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert len(list(loader)) == 9  # iterating again starts new feeders
    loader.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"feeders": -1}, "feeders must be 'auto' or an int >= 0"),
    ({"feeders": "many"}, "feeders must be 'auto' or an int >= 0"),
    ({"feeders": 3, "num_workers": 2}, "num_workers must be >= feeders"),
    ({"feeders": 1, "transform": lambda image: image},
     "feeders need an ImageFolder or captioned dataset and an ImageTransform .*; the transform is a function;"),
])
def test_feeders_are_refused_where_they_cannot_run(packed: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LoaderError, match=message):
        _loader(packed, **kwargs)


def test_auto_runs_no_feeders_on_the_cpu_route(packed: Path) -> None:
    with _loader(packed) as loader:
        assert loader.feeders == 0 and loader._supply.pool is None


def test_a_script_without_a_main_guard_runs_once(packed: Path, tmp_path: Path) -> None:
    """Feeders are spawned processes; the training script is not re-run in them."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        from shardkit import ShardLoader, transforms
        print("script body runs", flush=True)
        loader = ShardLoader({str(packed)!r}, batch_size=8, transform=transforms.imagenet_val(32), num_workers=2,
                             feeders=2)
        print("batches", sum(1 for _ in loader), flush=True)
        loader.close()
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["script body runs", "batches 9"], done.stdout


@pytest.mark.parametrize("feeders", [0, 2])
def test_a_second_iteration_ends_the_first_and_close_ends_both(packed: Path, feeders: int) -> None:
    """With or without feeders: iterating again starts the next epoch and the older iterator ends
    with a LoaderError saying why (never a hang, never the newer epoch's batches, which the
    in-process CPU route's first iterator used to take); so does close()."""
    with _loader(packed, feeders=0) as plain:
        plain.set_epoch(1)
        want = [k for _, _, k in plain]
    with _loader(packed, feeders=feeders) as loader:
        first = iter(loader)
        next(first)
        time.sleep(1.0)  # workers and feeders run ahead
        assert [k for _, _, k in loader] == want  # epoch 1, not epoch 0's leftovers
        with pytest.raises(LoaderError, match="epoch 0 ended after 1 of 9 batches: a newer iteration"):
            next(first)
        again = iter(loader)
        next(again)
        loader.close()
        with pytest.raises(LoaderError, match="epoch 2 ended after 1 of 9 batches: the loader was closed"):
            next(again)


def test_an_elastic_epoch_run_again_whole(packed: Path) -> None:
    """After an elastic resume's remainder, set_epoch of that epoch runs it whole (the stream's
    remainder is dropped; it used to stay, with and without feeders)."""
    with _loader(packed, feeders=0) as plain:
        it = iter(plain)
        next(it)
        state = plain.state_dict()
        del it
        whole = [k for _, _, k in plain]  # epoch 1, whole
    for feeders in (0, 1):
        with _loader(packed, batch_size=5, feeders=feeders) as loader:
            loader.load_state_dict(state)
            assert len(list(loader)) < len(whole) * 8 / 5  # the rest of epoch 0, in batches of 5
            loader.set_epoch(0)
            assert sum(len(k) for _, _, k in loader) == 69  # all 69 samples (one rank: the last batch short)


def test_a_worker_killed_in_a_feeder_is_named(packed: Path) -> None:
    loader = _loader(packed, feeders=1, prefetch=1)
    it = iter(loader)
    next(it)
    assert loader._supply.pool is not None
    feeder = loader._supply.pool.pids[0]
    worker = int(Path(f"/proc/{feeder}/task/{feeder}/children").read_text().split()[0])
    os.kill(worker, signal.SIGKILL)
    with pytest.raises(LoaderError, match=rf"in feeder process 0: DataLoader worker \d \(pid {worker}\) was killed"):
        for _ in it:
            pass
    assert sum(1 for _ in loader) == 9  # the next epoch runs on new workers
    loader.close()


class _ScriptCrop(RandomResizedCropFlip):  # stands for a transform defined in a training script
    pass


def test_a_transform_a_feeder_cannot_load_is_refused_by_name(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import __main__

    monkeypatch.setattr(_ScriptCrop, "__module__", "__main__")
    monkeypatch.setattr(__main__, "_ScriptCrop", _ScriptCrop, raising=False)
    with pytest.raises(LoaderError, match=r"cannot be sent to another process .*_ScriptCrop.*feeders=0"):
        _loader(packed, feeders=1, transform=_ScriptCrop((32, 32)))


def test_a_script_that_does_not_close_its_loader_exits(packed: Path, tmp_path: Path) -> None:
    """A finalizer registered before multiprocessing's exit hook (here by tempfile) used to leave
    the feeders waiting and the interpreter joining them forever."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import tempfile
        scratch = tempfile.TemporaryDirectory()
        from shardkit import ShardLoader, transforms
        loader = ShardLoader({str(packed)!r}, batch_size=8, transform=transforms.imagenet_val(32), num_workers=2,
                             feeders=1)
        it = iter(loader)
        next(it)
        print("done", flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr


def test_auto_feeders_that_cannot_start_leave_the_route_in_this_process(
        packed: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """With feeders="auto" (the GPU route's default), a machine where feeders cannot start (CUDA IPC
    refused in a container, say) gets one warning and the route in the training process."""
    from shardkit.loader import loader as loader_module
    from shardkit.loader.feed import pool as feeders

    def refuse(self: feeders.FeederPool) -> None:
        raise LoaderError("feeder processes could not start (RuntimeError: pidfd_getfd: Operation not permitted)")

    with _loader(packed, feeders=0) as plain:
        want = [k for _, _, k in plain]
    monkeypatch.setattr(loader_module, "feeder_count", lambda *args, **kwargs: (1, SlotLabels()))  # "auto": one
    monkeypatch.setattr(feeders.FeederPool, "start", refuse)
    monkeypatch.setattr(feeders.FeederPool, "launch", refuse)
    monkeypatch.setattr(feeders, "ready", lambda: True)  # launched at once, not once a busy machine's forkserver is up
    with _loader(packed) as loader, caplog.at_level("WARNING", logger="shardkit.loader"):
        assert loader.feeders == 1
        assert [k for _, _, k in loader] == want  # the first batches come from here while they start
        assert loader.feeders == 0 and loader._supply.pool is None
    assert caplog.text.count("feeder processes could not start") == 1 and "runs in this process" in caplog.text
    with _loader(packed, feeders=1) as loader, pytest.raises(LoaderError, match="pidfd_getfd"):
        next(iter(loader))  # asked for by number: the error, not a fallback


def test_a_feeder_dead_between_epochs_is_named_then_replaced(packed: Path) -> None:
    with _loader(packed, feeders=2) as loader:
        assert len(list(loader)) == 9
        assert loader._supply.pool is not None
        pid = loader._supply.pool.pids[1]
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):  # until the kernel has reaped it from the pipe's point of view
            if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                break
            time.sleep(0.05)
        with pytest.raises(LoaderError, match=rf"feeder process 1 \(pid {pid}\) was killed by SIGKILL"):
            list(loader)
        assert len(list(loader)) == 9  # new feeders
        assert pid not in loader._supply.pool.pids


def test_a_mix_through_feeders(packed: Path, tmp_path: Path) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(packed, other)
    got = {}
    for feeders in (0, 2):
        with ShardLoader([str(packed), str(other)], weights=[0.7, 0.3], batch_size=8, transform=T, num_workers=3,
                         feeders=feeders, keys=True, seed=1) as loader:
            got[feeders] = _epochs(loader)
    _same(got[0], got[2])


@pytest.mark.skipif(not libjpeg.available(), reason="shardkit's C extension is not built")
def test_feeders_log_through_the_training_processs_handlers(tmp_path: Path) -> None:
    """A warning logged in a feeder's worker (a JPEG libjpeg decodes with a warning) reaches the
    handlers the training process configured, with the sample's name; a spawned feeder has no
    logging configuration of its own."""
    src = tmp_path / "src"
    make_indexed_imagefolder(src, classes=2, per_class=6, size=(64, 48))
    for path in sorted(src.rglob("*.jpg"))[::4]:
        _with_stray_bytes(path)
    pack(str(src), str(tmp_path / "ds"), options=PackOptions(max_count=4), workers=1)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger, keep = logging.getLogger("shardkit"), Keep(level=logging.WARNING)
    logger.addHandler(keep)
    try:
        with _loader(tmp_path / "ds", feeders=2, num_workers=2, keys=False, batch_size=4) as loader:
            assert sum(1 for _ in loader) == len(loader)
    finally:
        logger.removeHandler(keep)
    relayed = [r for r in records if r.process != os.getpid() and "libjpeg: Corrupt JPEG data" in r.getMessage()]
    assert relayed and all(".tar:" in r.getMessage() for r in relayed), [r.getMessage() for r in records]


def test_feeders_decode_with_the_library_chosen_when_the_loader_was_built(packed: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """prefer_decoder is process-wide and feeders start later (with "auto", behind the first
    batches): they take the choice in force when the loader was built, not the one at their start."""
    from shardkit.codec.backend import prefer_decoder
    from shardkit.loader import loader as loader_module

    prefer_decoder("pil")
    try:
        loader = _loader(packed, feeders=2)
    finally:
        prefer_decoder(None)
    monkeypatch.setattr(loader_module, "FeederPool", lambda specs: specs)
    try:
        specs: Any = loader._feeder_pool(2)  # the specs the pool would have been given
        assert [spec.decoder for spec in specs] == ["pil", "pil"]
    finally:
        loader.close()


@pytest.mark.parametrize("feeders", [0, 1])
def test_a_loader_copied_while_its_processes_run_starts_its_own(packed: Path, feeders: int) -> None:
    """Pickled or deep-copied mid-epoch, its workers (and feeders) running: the copy starts
    processes of its own and gives the next epoch; the original goes on with its epoch, untouched.
    The copy failed with torch's "cannot be pickled" (a worker iterator) or "Pickling an
    AuthenticationString object is disallowed" (a feeder process)."""
    import copy
    import pickle

    with _loader(packed, feeders=0) as plain:
        want = _epochs(plain, epochs=2)
    with _loader(packed, feeders=feeders) as loader:
        loader.set_epoch(0)
        it = iter(loader)
        got = [next(it), next(it)]
        for twin in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
            with twin:
                _same(want[9:], _epoch_of(twin))
        got += list(it)
    _same(want[:9], got)


def _epoch_of(loader: ShardLoader) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    return list(loader)
