"""Packing on a real two-node Ray cluster started on this machine with ``ray start``, as on a real
cluster: a head node and a second node joined to it (1 CPU each, so that tasks must spread),
a remote source and a remote destination (S3 on the moto server). Shards are written on both
nodes (the pack reports the node of every shard) and are byte-identical to the process pool's.

Every Ray driver (the probe, ``shardkit pack --ray``) runs in a subprocess: Ray keeps per-process
state (the cluster it is connected to, the auth token it loaded) that other test modules' local
clusters would otherwise share. The cluster is stopped by killing the process groups this module
started, never with ``ray stop`` (which stops every Ray process of the machine).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardkit.pack import PackOptions, pack
from shardkit.storage import Store
from tests.conftest import upload_tree

pytest.importorskip("ray", reason="ray is not installed (pip install 'shardkit[ray]')")

ROOT = Path(__file__).resolve().parents[2]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this interpreter
OPTIONS = PackOptions(max_count=2, seed=1)

#: Waits for the two nodes, then prints {node id: its "sk_" resources} (the probe's driver).
_PROBE = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps({n["NodeID"]: sorted(k for k in n["Resources"] if k.startswith("sk_"))
                  for n in ray.nodes() if n["Alive"]}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports() -> list[str]:
    """Every port a node opens, chosen free: other Ray clusters may run on this machine too."""
    return ["--node-manager-port", str(_free_port()), "--object-manager-port", str(_free_port()),
            "--metrics-export-port", str(_free_port()),
            "--runtime-env-agent-port", str(_free_port()),
            "--dashboard-agent-listen-port", str(_free_port()),
            "--dashboard-agent-grpc-port", str(_free_port())]


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the head node did not open port {port} (exit code {proc.poll()})")


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # what a process needs to join or drive this cluster
    roles: dict[str, str]  # node id -> "sk_head" / "sk_worker"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop the process groups of ``procs`` (each node's raylet, GCS, workers …)."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5  # a node drains for up to 30 s on SIGTERM: no need here
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp = tempfile.mkdtemp(prefix="skray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    token = Path(temp) / "token"
    token.write_text(secrets.token_hex(32))
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    common = ["start", "--block", "--num-cpus", "1", "--object-store-memory", str(80 << 20),
              "--temp-dir", temp, "--disable-usage-stats"]
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, log: str) -> None:
        with open(Path(temp) / log, "wb") as out:
            procs.append(subprocess.Popen([*RAY, *common, *_ports(), *args], env=env, cwd=ROOT, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start("--head", "--port", str(port), "--include-dashboard", "false", "--resources",
              '{"sk_head": 1}', log="head.log")
        address = f"127.0.0.1:{port}"
        _wait_for_port(port, procs[0], timeout=60)  # a node started earlier backs off for long
        start("--address", address, "--resources", '{"sk_worker": 1}', log="worker.log")
        probe = subprocess.run([sys.executable, "-c", _PROBE, address], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=90)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in Path(temp).glob("*.log")}
        assert probe.returncode == 0, (probe.stderr[-3000:], logs)
        roles = {node: "+".join(tags) for node, tags in json.loads(probe.stdout).items()}
        assert sorted(roles.values()) == ["sk_head", "sk_worker"], (roles, logs)
        yield Cluster(address, env, roles)
    finally:
        _stop(procs)
        shutil.rmtree(temp, ignore_errors=True)
    assert not _left(procs), "processes of the Ray cluster are still running"


def _left(procs: list[subprocess.Popen[bytes]], wait: float = 10.0) -> list[int]:
    """The process groups of ``procs`` with a process left (killed ones take a moment to be
    reaped)."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for proc in procs:
            try:
                os.killpg(proc.pid, 0)
                left.append(proc.pid)
            except ProcessLookupError:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _objects(url: str, options: dict[str, Any]) -> dict[str, str]:
    store = Store(url, options)
    return {name: hashlib.sha256(store.read_bytes(name)).hexdigest() for name in store.listdir()}


def _cli(cluster: Cluster, *args: str, options: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    endpoint = options["client_kwargs"]["endpoint_url"]
    return subprocess.run([sys.executable, "-m", "shardkit", "pack", *args, f"--ray={cluster.address}",
                           "--max-count", str(OPTIONS.max_count), "--seed", str(OPTIONS.seed),
                           "-o", f"client_kwargs.endpoint_url={endpoint}", "-o", f"key={options['key']}",
                           "-o", f"secret={options['secret']}"],
                          env=cluster.env, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(180)
def test_two_nodes_pack_a_bucket_into_a_bucket(cluster: Cluster, small_tree: Path,
                                               s3_server: dict[str, Any], s3_bucket: str) -> None:
    src = f"{s3_bucket}/train"
    upload_tree(small_tree, src, s3_server)
    pack(src, f"{s3_bucket}/processes", options=OPTIONS, workers=2, storage_options=s3_server)

    done = _cli(cluster, src, f"{s3_bucket}/ray", options=s3_server)
    assert done.returncode == 0, done.stderr
    assert _objects(f"{s3_bucket}/ray", s3_server) == _objects(f"{s3_bucket}/processes", s3_server)
    # "ray       6 shards written on 2 nodes (3 on 1a2b3c4d, 3 on 5e6f7a8b)"
    [line] = [line for line in done.stdout.splitlines() if line.startswith("ray ")]
    assert "6 shards written on 2 nodes" in line, done.stdout
    per_node = dict(part.split(" on ")[::-1] for part in line.split("(")[1].rstrip(")").split(", "))
    assert sorted(cluster.roles[n] for short in per_node for n in cluster.roles
                  if n.startswith(short)) == ["sk_head", "sk_worker"], (per_node, cluster.roles)
    assert all(int(count) >= 1 for count in per_node.values())


@pytest.mark.timeout(120)
def test_a_local_source_is_refused_on_two_nodes(cluster: Cluster, small_tree: Path,
                                                s3_server: dict[str, Any], s3_bucket: str) -> None:
    done = _cli(cluster, str(small_tree), f"{s3_bucket}/refused", options=s3_server)
    assert done.returncode == 1, done.stdout
    # small_tree mixes JPEG and PNG: pack's warning about it may come first, on a line of its own
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {small_tree}: the source is a local path but the Ray cluster has 2 nodes: "
        "workers on other nodes would not find its files; pack from a shared URL (s3://, gs://, …) "
        "or use a single-node cluster")
    assert not [n for n in Store(f"{s3_bucket}/refused", s3_server).listdir() if not n.startswith(".")]
