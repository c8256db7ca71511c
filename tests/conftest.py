"""Shared fixtures: tiny image bytes and a moto S3 server on loopback (no network)."""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import signal
import sys
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from PIL import Image

from tests.ports import free_port

if importlib.util.find_spec("xdist") is not None:  # `pytest` runs without pytest-xdist too
    from tests.scheduling import pytest_xdist_make_scheduler  # noqa: F401  (a hook: the suite's --dist loadfile)

# One compute thread per test process, and for every process a test starts (torchrun ranks,
# feeders, CLIs inherit the environment). The suite runs a pytest-xdist worker per core, so a
# second OpenMP thread per process only oversubscribes the cores: each of torch's parallel
# regions then waits for a thread the other worker has descheduled, and a small CPU training
# step runs 4-5x slower than on one thread. Set before torch is imported by any test module.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
if "torch" in sys.modules:  # imported already (by a plugin): its thread pool may be sized
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Ctrl-C as in a terminal, for this process and every process a test starts: a shell without job
# control (a script, `sh -c`) runs a command it puts in the background (`make test &`) with SIGINT
# ignored, which its children inherit, and the tests that press Ctrl-C would then see a pack that
# never stops.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: Handlers a test must leave as it found them in its process (the pytest-xdist worker).
_PROCESS_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _signal_handlers_left_as_found() -> Iterator[None]:
    """A test that leaves the handler of SIGINT or SIGTERM changed fails, and the handler is put
    back: a later test of the same worker that sends itself the signal would meet it instead (an
    interrupted command run in-process once left one that ends the process at once, and a test
    files later killed its worker, in some orders of the files only)."""
    before = {sig: signal.getsignal(sig) for sig in _PROCESS_SIGNALS}
    yield
    changed = [sig for sig, handler in before.items() if signal.getsignal(sig) != handler]
    for sig in changed:
        if before[sig] is not None:  # None: set outside Python, cannot be put back
            signal.signal(sig, before[sig])
    if changed:
        pytest.fail("the test left the handler of " + " and ".join(signal.Signals(s).name for s in changed)
                    + " changed in its process", pytrace=False)


@pytest.fixture(autouse=True)
def _loaders_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ShardLoader a test built (or unpickled) and that is still alive when the test ends is
    closed then, as a training script's ``with ShardLoader(...)`` would: its worker processes,
    pipes, shared memory and open shard files would otherwise last until the garbage collector
    found it (much later where an exception's traceback holds it), and a pytest-xdist worker
    running a few hundred such tests once held more than 1023 open descriptors. Held weakly: a
    test that drops a loader still sees what dropping it does. Only where the test process has
    imported the loader already (a test of imports must not see it imported here)."""
    module = sys.modules.get("shardkit.loader.loader")
    if module is None:
        yield
        return
    cls = module.ShardLoader
    built: weakref.WeakSet[Any] = weakref.WeakSet()
    init, setstate = cls.__init__, cls.__setstate__

    @functools.wraps(init)  # a subclass made in a test takes its signature from it
    def tracked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.add(self)

    @functools.wraps(setstate)
    def tracked_setstate(self: Any, state: dict[str, Any]) -> None:
        setstate(self, state)
        built.add(self)

    monkeypatch.setattr(cls, "__init__", tracked_init)
    monkeypatch.setattr(cls, "__setstate__", tracked_setstate)
    yield
    for loader in list(built):
        loader.close()


def encode_image(size: tuple[int, int] = (12, 9), mode: str = "RGB", fmt: str = "JPEG",
                 color: Any = None) -> bytes:
    """Encode a flat image; ``color`` defaults to something mode-appropriate."""
    if color is None:
        color = {"L": 77, "CMYK": (10, 20, 30, 40), "RGBA": (1, 2, 3, 4)}.get(mode, (200, 100, 50))
    out = io.BytesIO()
    Image.new(mode, size, color).save(out, fmt)
    return out.getvalue()


@pytest.fixture
def image_bytes() -> Callable[..., bytes]:
    """``image_bytes(size=, mode=, fmt=, color=)`` -> encoded bytes of a flat image."""
    return encode_image


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1; yields fsspec ``storage_options`` that reach it."""
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    yield {"client_kwargs": {"endpoint_url": endpoint}, "key": "test", "secret": "test",
           "skip_instance_cache": True}
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: dict[str, Any]) -> str:
    """A fresh, empty bucket on the moto server; returns its ``s3://`` URL."""
    import s3fs

    name = f"test-{uuid.uuid4().hex[:16]}"
    fs = s3fs.S3FileSystem(**s3_server)
    fs.mkdir(name)
    return f"s3://{name}"


def write_tree(root: Any, files: dict[str, bytes]) -> None:
    """Write ``{relative path: bytes}`` under ``root`` (a ``pathlib.Path``)."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.fixture
def small_tree(tmp_path: Any) -> Any:
    """A valid ImageFolder tree: 3 classes x 4 tiny JPEG/PNG images (distinct bytes)."""
    root = tmp_path / "src"
    files = {}
    for c in range(3):
        for j in range(4):
            fmt, ext = ("PNG", "png") if j == 3 else ("JPEG", "jpg")
            files[f"class{c}/img{j}.{ext}"] = encode_image((8 + j, 6 + c), fmt=fmt,
                                                           color=(c * 80, j * 60, 9))
    write_tree(root, files)
    return root


def upload_tree(root: Any, url: str, storage_options: dict[str, Any] | None = None) -> None:
    """Copy every file under ``root`` (a ``pathlib.Path``; no links) to the fsspec ``url``, one
    object per file at its relative path, as ``aws s3 sync`` would."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(url, **(storage_options or {}))
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{base}/{path.relative_to(root).as_posix()}", path.read_bytes())


#: Test files that start processes by the dozen (torchrun ranks, Ray nodes, feeders, a pty per
#: case), train a model on the CPU or build a wheel: `make check` leaves them to `make test`.
SLOW_FILES = frozenset({
    "tests/bench/test_dali.py", "tests/bench/test_train.py", "tests/bench/test_train_detection.py",
    "tests/cli/test_terminal.py", "tests/interop/test_dali.py", "tests/interop/test_other_readers.py",
    "tests/loader/feed/test_feeders.py", "tests/loader/feed/test_feeder_logs.py", "tests/loader/run/test_shm_leaks.py",
    "tests/loader/run/test_worker_death.py", "tests/loader/test_ddp.py", "tests/pack/test_hostile_inputs.py",
    "tests/pack/test_ray.py", "tests/pack/test_ray_cluster.py", "tests/pack/test_resume.py",
    "tests/pipelines/test_torchrun.py", "tests/pipelines/test_torchrun_detector.py",
    "tests/pipelines/test_train_classifier.py", "tests/pipelines/test_train_contrastive.py",
    "tests/pipelines/test_train_detector.py", "tests/loader/service/test_service_cluster.py",
    "tests/storage/test_remote_faults.py", "tests/test_wheel.py", "tests/pack/test_remote_source.py",
    "tests/loader/feed/test_caption_feeders.py", "tests/loader/read/test_remote_loader.py",
})

#: Single tests of otherwise quick files that take seconds each (a Triton kernel interpreted on
#: the CPU, ranks over gloo, property tests of hundreds of cases), also left out of `make check`.
SLOW_TESTS = frozenset({
    "tests/transforms/test_gpu_ragged.py::test_triton_kernel_interpreted_on_cpu_matches_eager",
    "tests/transforms/test_gpu_resize.py::test_triton_kernel_interpreted_on_cpu_matches_eager",
    "tests/transforms/test_iou_crop.py::test_same_params_and_generator_state_as_torchvision",
    "tests/loader/epochs/test_mix.py::test_a_mix_resumes_exactly_and_elastically",
    "tests/loader/epochs/test_elastic.py::test_the_rest_of_the_epoch_is_what_was_not_delivered",
    "tests/loader/test_even_batches.py::test_gloo_ranks_evaluate_each_sample_once",
    "tests/loader/run/test_lifecycle.py::test_close_stops_the_workers_and_the_loader_still_works_after",
    "tests/loader/run/test_read_ahead.py::test_read_ahead_gives_the_batches_of_epochs_run_one_at_a_time",
    "tests/loader/read/test_decode_warnings.py::test_loader_workers_print_no_raw_libjpeg_warnings",
    "tests/doctor/test_doctor.py::test_doctor_in_a_terminal",
})


#: The longest test files, longest first (from `pytest --durations`): they are collected first, so
#: pytest-xdist (one file per worker at a time) starts them first and the short files fill in
#: around them, instead of one long file running alone at the end while the other core idles.
FIRST_FILES = (
    "tests/loader/service/test_service_cluster.py",
    "tests/pipelines/test_torchrun.py", "tests/pipelines/test_torchrun_detector.py", "tests/loader/test_ddp.py",
    "tests/bench/test_train.py", "tests/loader/run/test_shm_leaks.py", "tests/bench/test_train_detection.py",
    "tests/loader/feed/test_feeders.py", "tests/test_wheel.py", "tests/bench/test_isolate.py",
    "tests/transforms/test_gpu_ragged.py", "tests/cli/test_terminal.py", "tests/pack/test_ray_cluster.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    rank = {name: i for i, name in enumerate(FIRST_FILES)}

    def first(item: pytest.Item) -> int:
        try:
            return rank.get(item.path.relative_to(root).as_posix(), len(FIRST_FILES))
        except ValueError:
            return len(FIRST_FILES)

    items.sort(key=first)  # stable: within a file, and among the other files, the order stays
    for item in items:
        try:
            rel = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if rel in SLOW_FILES or f"{rel}::{item.name.split('[')[0]}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
