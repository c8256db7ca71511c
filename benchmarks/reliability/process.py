"""The reliability experiments that run whole processes: ``kill -9`` during pack (R4), S3
faults through a fault-injecting proxy and what an S3 load with workers prints (R5). Run by
``python -m benchmarks.reliability``, which writes the report.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks.reliability.report import Row, child_env, fmt_counts
from shardkit.errors import ShardkitError
from shardkit.pack import PackOptions, pack
from tests.cli.terminal import shardkit_argv
from tests.faultproxy import FaultProxy
from tests.keepalive import KeepAliveProxy
from tests.loader.read.test_remote_loader import LOAD_WITH_WORKERS as S3_LOAD


def _mapped_semaphores(pid: int) -> set[str]:
    """The paths of the POSIX semaphores (``/dev/shm/sem.*``) process ``pid`` has mapped, named or
    already unlinked (a line ending in ``(deleted)``): after a kill, none of them may exist."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
        return {fields[5].rstrip().removesuffix(" (deleted)") for fields in (line.split(maxsplit=5) for line in f)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/sem.")}
    return set()

def _r4_tree(work: Path) -> Path:
    """120 small JPEGs in 4 classes, 8 of them not images (skipped entries in index.json)."""
    root = work / "r4src"
    rng = random.Random(4)
    for c in range(4):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(30):
            out = io.BytesIO()
            Image.new("RGB", (48, 40), (rng.randrange(256), j * 8, c * 60)).save(out, "JPEG")
            data = out.getvalue() if j % 15 != 7 else b"not an image " * 3
            (root / f"c{c}" / f"{j:03d}.jpg").write_bytes(data)
    return root


def _pack_cmd(src: Path, dst: Path) -> list[str]:
    return [*shardkit_argv(), "pack", str(src), str(dst), "--max-count", "4", "--workers", "2", "-q"]


def _tree(work: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in work.iterdir()}


def r4_kill(work: Path, kills: int = 12) -> list[Row]:
    src = _r4_tree(work)
    ref = work / "r4ref"
    subprocess.run(_pack_cmd(src, ref), env=child_env(), check=True, timeout=300)
    reference = _tree(ref)
    import psutil

    rng = random.Random(14)
    identical = interrupted = group_leaked = 0
    for trial in range(kills):
        dst = work / f"r4-{trial}"
        proc = subprocess.Popen(_pack_cmd(src, dst), env=child_env(), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = rng.randrange(1, 28)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and (
                len(list(dst.glob("*.tar"))) if dst.exists() else 0) < target:
            time.sleep(0.002)
        group_sems: set[str] = set()
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for c in psutil.Process(proc.pid).children():
                    group_sems |= _mapped_semaphores(c.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            interrupted += 1
        proc.wait()
        time.sleep(0.2)
        group_leaked += sum(os.path.exists(s) for s in group_sems)
        subprocess.run(_pack_cmd(src, dst), env=child_env(), timeout=300, capture_output=True)
        identical += _tree(dst) == reference
    # kill -9 of the parent alone: what outlives it
    orphans = leaked = 0
    parents = 3
    for trial in range(parents):
        dst = work / f"r4p-{trial}"
        proc = subprocess.Popen([*_pack_cmd(src, dst)[:-5], "--max-count", "1", "--workers", "2", "-q"],
                                env=child_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        parent = psutil.Process(proc.pid)
        children: list[Any] = []
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            children = parent.children()
            if sum("spawn_main" in " ".join(c.cmdline()) for c in children) == 2 and any(dst.glob("*.tar")):
                break
            time.sleep(0.01)
        sems: set[str] = set()
        for c in children:
            sems |= _mapped_semaphores(c.pid)
        proc.kill()
        proc.wait()
        _gone, alive = psutil.wait_procs(children, timeout=20)
        orphans += len(alive)
        for c in alive:
            c.kill()
        time.sleep(0.5)
        leaked += sum(os.path.exists(s) for s in sems)
    # a kill after index.json, before the clean-up: the state as it stays, then the re-run
    late = work / "r4late"
    subprocess.run(_pack_cmd(src, late), env=child_env(), check=True, timeout=300)
    (late / ".shardkit-pack").mkdir()
    (late / ".shardkit-pack" / "plan.json").write_text("{}")
    subprocess.run(_pack_cmd(src, late), env=child_env(), check=True, timeout=300, capture_output=True)
    state_left = (late / ".shardkit-pack").exists()
    return [
        ("R4", "kill -9 during pack (process group)", f"{kills} packs of 120 JPEGs (8 not images, so index.json "
         f"lists skips), 2 workers, 4 per shard, SIGKILL at a random shard count (seed 14), then the same "
         f"command", f"{interrupted} interrupted; {identical}/{kills} resumed destinations byte-identical to an "
         f"uninterrupted pack (shards and index.json), no leftover state; pool semaphores left in /dev/shm by the "
         f"killed groups: {group_leaked}", "all byte-identical; 0 semaphores"),
        ("R4", "kill -9 of the pack process alone", f"{parents} packs, SIGKILL of the parent while 2 workers "
         "write; a re-run after a kill between index.json and the clean-up", f"processes alive 20 s later: "
         f"{orphans}; pool semaphores left in /dev/shm: {leaked}; pack state left after the re-run: "
         f"{'yes' if state_left else 'no'}", "0 processes, 0 semaphores, no state left"),
    ]


def r5_remote(work: Path) -> list[Row]:
    import s3fs
    from moto.server import ThreadedMotoServer

    from shardkit.index import verify_dataset

    with contextlib.closing(__import__("socket").socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    base = {"key": "k", "secret": "s", "skip_instance_cache": True}
    s3fs.S3FileSystem(**base, client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"}).mkdir("reliability")
    src = work / "r4src" if (work / "r4src").exists() else _r4_tree(work)
    local = pack(str(src), str(work / "r5local"), options=PackOptions(max_count=8), workers=1)
    rows: list[Row] = []
    try:
        for rate in (0.05, 0.2):
            rng = random.Random(5)

            def faults(_n: int, rng: random.Random = rng, rate: float = rate) -> Any:
                if rng.random() >= rate:
                    return None
                return rng.choice(["reset", ("truncate", rng.randrange(1, 3000))])

            runs, completed, identical, foreign = 6, 0, 0, collections.Counter[str]()
            injected = 0
            for trial in range(runs):
                proxy = FaultProxy(("127.0.0.1", port), faults)
                options = {**base, "client_kwargs": {"endpoint_url": proxy.url}}
                url = f"s3://reliability/r5-{rate}-{trial}"
                try:
                    result = pack(str(src), url, options=PackOptions(max_count=8), workers=1,
                                  storage_options=options)
                    report = verify_dataset(url, decode=False, storage_options=options)
                    completed += report.ok
                    identical += result.manifest.shards == local.manifest.shards
                except ShardkitError as err:
                    foreign[type(err).__name__] += 1
                except Exception as err:  # noqa: BLE001 - the point is to count these
                    foreign["FOREIGN " + type(err).__name__] += 1
                finally:
                    injected += proxy.injected
                    proxy.close()
            rows.append(("R5", f"remote faults at {rate:.0%} of connections", f"{runs} packs of 120 JPEGs to S3 "
                         "(moto) and verify back, through a proxy on 127.0.0.1 that resets or cuts short "
                         f"{rate:.0%} of connections (seed 5)", f"{injected} faults injected; {completed}/{runs} "
                         f"completed and verified, {identical}/{runs} shards identical to a local pack; errors: "
                         f"{fmt_counts(foreign) if foreign else 'none'}", "all complete, identical"))
        proxy = FaultProxy(("127.0.0.1", port), lambda n: ("truncate", 300))
        cmd = [*shardkit_argv(), "info", "s3://reliability/r5-0.05-0", "-o", "key=k", "-o", "secret=s",
               "-o", f"client_kwargs.endpoint_url={proxy.url}", "-o", "config_kwargs.retries.max_attempts=1"]
        done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120)
        proxy.close()
        lines = done.stderr.strip().splitlines()
        rows.append(("R5", "permanent remote fault", "`shardkit info` through a proxy that cuts every response "
                     "after 300 bytes", f"exit {done.returncode}, {len(lines)} line(s) on stderr: "
                     f"`{lines[-1][:150] if lines else ''}…`", "one line, no traceback"))
        rows.append(_r5_quiet(port, base, work))
    finally:
        server.stop()
    return rows


def _r5_quiet(port: int, base: dict[str, Any], work: Path) -> Row:
    """An S3 load with workers, as its own process, through a keep-alive proxy (moto closes every
    connection; S3 keeps them, and the fault needs a pooled one): what it prints on stderr."""
    import json

    proxy = KeepAliveProxy(("127.0.0.1", port))
    options = {**base, "client_kwargs": {"endpoint_url": proxy.url}}
    runs, lines, failed = 3, 0, 0
    try:
        for trial in range(runs):
            done = subprocess.run([sys.executable, "-c", S3_LOAD, "s3://reliability/r5-0.05-0", json.dumps(options),
                                   str(work / f"r5cache-{trial}")], env=child_env(), capture_output=True, text=True,
                                  timeout=300)
            failed += done.returncode != 0 or done.stdout.split() != ["True"]
            lines += len([line for line in done.stderr.splitlines() if line.strip()])
    finally:
        proxy.close()
    return ("R5", "what an S3 load with workers prints", f"{runs} loads of the 5% dataset above (2 workers) through "
            "a keep-alive proxy, each as its own process, a garbage collection forced in each worker's fsspec IO "
            "thread (where a long load's collections land: it frees the S3 client inherited from the main "
            "process)", f"{runs - failed}/{runs} complete; {lines} lines on stderr (was: 'Task exception was "
            "never retrieved ... attached to a different loop' tracebacks)", "0 lines")
