"""Kill ``shardkit pack`` (the whole process group, SIGKILL) at random points and resume it."""

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from PIL import Image

from shardkit.errors import PackError
from shardkit.pack import PackOptions, pack

MAX_COUNT = 6


@pytest.fixture(scope="module")
def many_images(tmp_path_factory):
    """300 small, distinct JPEGs in 5 classes; 3 of them are not images (skipped entries, whose
    order in index.json a resume must keep)."""
    root = tmp_path_factory.mktemp("many") / "src"
    rng = random.Random(0)
    for c in range(5):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(60):
            out = io.BytesIO()
            color = (rng.randrange(256), rng.randrange(256), c * 50)
            Image.new("RGB", (48, 40), color).save(out, "JPEG")
            (root / f"c{c}" / f"{j:03d}.jpg").write_bytes(out.getvalue())
    for rel in ("c0/007.jpg", "c2/031.jpg", "c4/059.jpg"):
        (root / rel).write_bytes(b"not an image, " * 4)
    return root


@pytest.fixture(scope="module")
def reference(many_images, tmp_path_factory):
    dst = tmp_path_factory.mktemp("ref") / "out"
    pack(str(many_images), str(dst), options=PackOptions(max_count=MAX_COUNT), workers=1)
    return {p.name: p.read_bytes() for p in dst.iterdir()}


def _arguments(src, dst, *extra):
    return ["pack", str(src), str(dst), "--max-count", str(MAX_COUNT), "--workers", "2", "--quiet", *extra]


def _command(src, dst, *extra):
    return [sys.executable, "-m", "shardkit", *_arguments(src, dst, *extra)]


# The pack's CLI with its POSIX semaphores named "<prefix>-<random>" instead of multiprocessing's
# "/mp-<random>" (``semprefix``, a CPython detail, checked here so that a Python without it fails
# loudly instead of leaving the names unfound).
_PACK_WITH_PREFIX = (
    "import sys, multiprocessing.process as p, multiprocessing.synchronize as s;"
    "p.current_process()._config['semprefix'] = prefix = sys.argv.pop(1);"
    "assert s.SemLock._make_name().startswith(prefix + '-'), 'semprefix is not used any more';"
    "from shardkit.cli import main; main()"
)


class _Semaphores:
    """The semaphore names in /dev/shm of the packs a test starts, told from any other process's by
    a prefix of the test's own. A ``kill -9`` of the whole process group while the pool's workers
    start leaves them there for good: the resource tracker, which would remove them, dies with the
    group, and the pack removes them only once every worker has opened them (``pack/pool.py``)."""

    def __init__(self) -> None:
        self.prefix = f"/shardkit-test-{uuid.uuid4().hex[:12]}"

    def command(self, src, dst, *extra) -> list[str]:
        return [sys.executable, "-c", _PACK_WITH_PREFIX, self.prefix, *_arguments(src, dst, *extra)]

    def left(self) -> list[str]:
        shm, start = Path("/dev/shm"), f"sem.{self.prefix[1:]}-"
        return sorted(p.name for p in shm.iterdir() if p.name.startswith(start)) if shm.is_dir() else []

    def remove(self) -> list[str]:
        left = self.left()
        for name in left:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")
        return left


@pytest.fixture
def pack_semaphores() -> Iterator[_Semaphores]:
    """What the test's packs leave in /dev/shm is removed after it, whatever happened."""
    own = _Semaphores()
    yield own
    own.remove()


def _visible(dst: Path) -> dict[str, bytes]:
    return ({p.name: p.read_bytes() for p in dst.iterdir() if not p.name.startswith(".")}
            if dst.exists() else {})


def _check_only_complete_files(dst: Path, reference: dict[str, bytes]) -> int:
    """Every visible file is byte-identical to the finished run's; others are hidden temporaries."""
    visible = _visible(dst)
    for name, data in visible.items():
        assert data == reference[name], f"{name} is visible but not complete"
    hidden = [p.name for p in dst.iterdir() if p.name.startswith(".")] if dst.exists() else []
    assert all(h == ".shardkit-pack" or ".tmp-" in h for h in hidden), hidden
    return sum(name.endswith(".tar") for name in visible)


def test_kill_at_random_points_then_resume(many_images, reference, tmp_path, pack_semaphores):
    dst = tmp_path / "out"
    rng = random.Random(1234)
    num_shards = sum(name.endswith(".tar") for name in reference)
    kills = 0
    for _ in range(4):
        target = rng.randrange(1, num_shards)
        proc = subprocess.Popen(pack_semaphores.command(many_images, dst), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            present = sum(1 for p in dst.glob("*.tar")) if dst.exists() else 0
            if present >= target:
                time.sleep(rng.uniform(0, 0.05))
                break
            time.sleep(0.002)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        pack_semaphores.remove()  # names of a pool killed while its workers started
        assert "index.json" not in _visible(dst) or proc.returncode == 0
        _check_only_complete_files(dst, reference)
    assert kills >= 2  # the test really interrupted the pack
    finished = subprocess.run(pack_semaphores.command(many_images, dst), capture_output=True, text=True,
                              timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert _visible(dst) == reference
    assert sorted(p.name for p in dst.iterdir()) == sorted(reference)  # state and temporaries gone
    assert not pack_semaphores.left()


def test_kill_9_of_the_whole_group_while_workers_start_then_resume(many_images, reference, tmp_path, pack_semaphores):
    """The one kill that leaves the pool's semaphore names in /dev/shm (see :class:`_Semaphores`):
    the test removes them, and the re-run finishes the pack and leaves none."""
    dst = tmp_path / "out"
    proc = subprocess.Popen(pack_semaphores.command(many_images, dst), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error, OSError):
                if any("spawn_main" in " ".join(c.cmdline()) for c in parent.children()):
                    break
            time.sleep(0.002)
        assert proc.poll() is None, "the pack ended before its workers started"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    pack_semaphores.remove()
    _check_only_complete_files(dst, reference)
    finished = subprocess.run(pack_semaphores.command(many_images, dst), capture_output=True, text=True,
                              timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert _visible(dst) == reference
    assert not pack_semaphores.left()


def test_different_command_into_unfinished_destination(many_images, reference, tmp_path):
    dst = tmp_path / "out"
    pack(str(many_images), str(dst), options=PackOptions(max_count=MAX_COUNT), workers=1)
    (dst / "index.json").unlink()
    (dst / ".shardkit-pack").mkdir()
    (dst / ".shardkit-pack" / "plan.json").write_text('{"fingerprint": "another run"}')
    refused = subprocess.run(_command(many_images, dst, "--seed", "3"), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert ("unfinished pack of different input or options" in refused.stderr
            and "--overwrite" in refused.stderr)
    done = subprocess.run(_command(many_images, dst, "--overwrite"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert _visible(dst) == reference


def test_complete_destination_is_kept_or_refused(small_tree, tmp_path):
    dst = str(tmp_path / "out")
    first = pack(str(small_tree), dst, workers=1)
    again = pack(str(small_tree), dst, workers=1)
    assert again.already_complete and again.manifest == first.manifest
    with pytest.raises(PackError, match=r"different packed dataset \(packed with seed=0, now 5\)"):
        pack(str(small_tree), dst, options=PackOptions(seed=5), workers=1)
    (small_tree / "class0" / "extra.jpg").write_bytes((small_tree / "class0" / "img0.jpg").read_bytes())
    with pytest.raises(PackError, match=r"\(same options, other input: source files"):
        pack(str(small_tree), dst, workers=1)
    (small_tree / "class0" / "extra.jpg").unlink()
    redone = pack(str(small_tree), dst, options=PackOptions(seed=5), workers=1, overwrite=True)
    assert redone.manifest.options["seed"] == 5


def test_a_damaged_finished_pack_is_not_called_complete(small_tree, tmp_path):
    dst = tmp_path / "out"
    first = pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    shards = [s.url for s in first.manifest.shards]
    (dst / shards[1]).unlink()
    with open(dst / shards[0], "r+b") as f:
        f.truncate(1000)
    with pytest.raises(PackError, match=rf"damaged: {shards[0]} has 1,000 bytes, index.json says "
                                        rf"[0-9,]+; {shards[1]} is missing; pass --overwrite"):
        pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    redone = pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1, overwrite=True)
    assert redone.manifest == first.manifest and (dst / shards[1]).exists()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_shard_rewritten_by_another_writer_stops_the_pack_before_it_publishes(small_tree, tmp_path, request,
                                                                                 where):
    """An object store has no lock: a second pack into the prefix rewrites shards under this one. The
    pack checks its shards' sizes before it writes index.json, and a re-run alone finishes it."""
    from shardkit.storage import Store

    options = {} if where == "local" else request.getfixturevalue("s3_server")
    dst = str(tmp_path / "out") if where == "local" else request.getfixturevalue("s3_bucket") + "/cc"
    store = Store(dst, options)
    done = []

    def other_writer(samples: int) -> None:  # per sample, in this process (workers=1)
        done.append(samples)
        if sum(done) == 5:  # the first shard (4 samples) is in place: another pack rewrites it
            store.write_bytes("shard-000000.tar", b"\0" * 10240)

    with pytest.raises(PackError, match=r"shard-000000.tar is 10,240 bytes, this pack wrote [0-9,]+: something "
                                        r"else wrote to the destination while this pack ran"):
        pack(str(small_tree), dst, options=PackOptions(max_count=4), workers=1, storage_options=options,
             progress=other_writer)
    assert "index.json" not in store.listdir()
    again = pack(str(small_tree), dst, options=PackOptions(max_count=4), workers=1, storage_options=options)
    assert not again.already_complete and again.reused_shards == len(again.manifest.shards) - 1
    assert store.file_sizes()["shard-000000.tar"] == again.manifest.shards[0].num_bytes  # a fresh listing


def test_an_unfinished_pack_does_not_resume_over_changed_files(small_tree, tmp_path):
    dst = str(tmp_path / "out")

    def stop(_n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1, progress=stop)
    image = small_tree / "class0" / "img1.jpg"
    st = image.stat()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten: same size, new mtime
    with pytest.raises(PackError, match="input files changed since it began"):
        pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1)
    pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1, overwrite=True)
    # A finished pack records no modification time: a touched tree is the same dataset.
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    again = pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1)
    assert again.already_complete


def test_non_empty_unrelated_destination_is_refused(small_tree, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("mine")
    with pytest.raises(PackError, match="not empty"):
        pack(str(small_tree), str(tmp_path / "out"), workers=1)
    pack(str(small_tree), str(tmp_path / "out"), workers=1, overwrite=True)
    # --overwrite removes only our files
    assert (tmp_path / "out" / "precious.txt").read_text() == "mine"


def test_killed_before_the_plan_was_recorded(small_tree, tmp_path):
    (tmp_path / "out" / ".shardkit-pack").mkdir(parents=True)
    (tmp_path / "out" / ".shard-000000.tar.tmp-0123456789ab").write_bytes(b"partial")
    pack(str(small_tree), str(tmp_path / "out"), workers=1)
    reference = pack(str(small_tree), str(tmp_path / "ref"), workers=1)
    assert (sorted(p.name for p in (tmp_path / "out").iterdir())
            == sorted(p.name for p in (tmp_path / "ref").iterdir()))
    assert reference.manifest.num_samples == 12



def test_resumed_index_is_byte_identical_with_skipped_entries(many_images, reference, tmp_path):
    """Receipts reused by a resume come back from the pack state as JSON: the skipped entries
    they carry must reach index.json exactly as an uninterrupted run writes them (key order
    included). A skip budget stops the first run with receipts on disk that list skips."""
    dst = tmp_path / "out"
    stopped = subprocess.run(_command(many_images, dst, "--max-skipped", "2"), capture_output=True,
                             text=True, timeout=120)
    assert stopped.returncode == 1 and "--max-skipped" in stopped.stderr, stopped.stderr
    receipts = [json.loads(p.read_text()) for p in (dst / ".shardkit-pack").glob("*.done.json")]
    assert sum(len(r["skipped"]) for r in receipts) >= 2  # the resume reuses receipts with skips
    resumed = subprocess.run(_command(many_images, dst), capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert len(json.loads(reference["index.json"])["skipped"]) == 3
    assert (dst / "index.json").read_bytes() == reference["index.json"]
    assert sorted(p.name for p in dst.iterdir()) == sorted(reference)


def test_rerun_after_kill_between_index_and_cleanup(many_images, reference, tmp_path):
    """A kill after index.json is written but before the pack state is removed: the re-run
    ("already packed") removes the state and temporaries, and touches nothing else."""
    dst = tmp_path / "out"
    first = subprocess.run(_command(many_images, dst), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    state = dst / ".shardkit-pack"  # what the killed run leaves: its state and a temporary
    state.mkdir()
    (state / "plan.json").write_text("{}")
    (state / "shard-000000.tar.done.json").write_text("{}")
    (dst / ".shard-000001.tar.tmp-0123456789ab").write_bytes(b"partial")
    again = subprocess.run(_command(many_images, dst), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in dst.iterdir()) == sorted(reference)
    assert _visible(dst) == reference


def _semaphores(pid: int, deleted: bool = False) -> set[str]:
    """The POSIX named semaphores (``/dev/shm/sem.*``) process ``pid`` has mapped: those whose name
    still exists, or with ``deleted`` those whose name was removed."""
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                path, gone = fields[5].rstrip("\n").removesuffix(" (deleted)"), fields[5].rstrip().endswith("(deleted)")
                if gone == deleted:
                    found.add(path)
    return found


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_kill_9_of_the_whole_group_leaves_no_semaphore(many_images, tmp_path, pack_semaphores):
    """``kill -9`` of the process group kills the resource tracker too, so it cannot remove the
    pool's semaphores: the pack removes their names itself once every worker has opened them."""
    dst = tmp_path / "out"
    proc = subprocess.Popen(pack_semaphores.command(many_images, dst, "--max-count", "1"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    try:
        workers: list[psutil.Process] = []
        named: set[str] = set()
        unnamed: set[str] = set()
        deadline = time.monotonic() + 60  # a bound for a regression, not a timing assertion
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error, OSError):
                workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
                named = set().union(set(), *(_semaphores(w.pid) for w in workers))
                unnamed = set().union(set(), *(_semaphores(w.pid, deleted=True) for w in workers))
                if len(workers) == 2 and unnamed and not named:
                    break
            time.sleep(0.01)
        assert proc.poll() is None, "the pack ended before the kill"
        assert len(workers) == 2 and unnamed and not named, f"names still in /dev/shm while packing: {named}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.2)
        assert not [s for s in unnamed if os.path.exists(s)]
        assert not pack_semaphores.left()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_kill_9_of_the_parent_leaves_no_process_or_semaphore(many_images, tmp_path, pack_semaphores):
    """``kill -9`` of the pack process alone (not its group): its workers and the resource
    tracker exit, and the tracker removes the pool's semaphores from /dev/shm."""
    dst = tmp_path / "out"
    proc = subprocess.Popen(pack_semaphores.command(many_images, dst, "--max-count", "1"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    children: list[psutil.Process] = []
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            children = parent.children()
            workers = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
            if len(workers) == 2 and any(dst.glob("*.tar")):
                break
            time.sleep(0.01)
        assert proc.poll() is None and len(workers) == 2, "the pack ended before the kill"
        # named, or already unnamed once every worker opened them (a kill of the whole group needs that)
        semaphores = set().union(*(_semaphores(w.pid) | _semaphores(w.pid, deleted=True) for w in workers))
        assert semaphores
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # Bounded wait (a regression fails here instead of hanging); not a timing assertion.
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"still running after the parent was killed: {alive}"
        deadline = time.monotonic() + 30
        while pack_semaphores.left() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [s for s in semaphores if os.path.exists(s)] and not pack_semaphores.left()
    finally:  # whatever happened, leave no process of this test behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for child in workers:  # the tracker then exits by itself and removes the semaphores
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        for child in psutil.wait_procs(children, timeout=10)[1]:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


@pytest.mark.parametrize("inside", ["link", "link/shards", "link/class0/deeper"])
def test_a_destination_inside_the_source_is_refused(small_tree, tmp_path, inside):
    src = tmp_path / "link"
    src.symlink_to(small_tree, target_is_directory=True)  # a link to the tree: resolved, still inside
    dst = tmp_path / inside
    before = sorted(p.name for p in small_tree.rglob("*"))
    with pytest.raises(PackError, match="is inside the source .*: the shards would become part of the tree"):
        pack(str(src), str(dst), workers=1)
    assert sorted(p.name for p in small_tree.rglob("*")) == before  # nothing written into the tree
    pack(str(src), str(tmp_path / "next-to-it"), workers=1)  # beside it is fine
