"""A real Ray cluster of several node processes on this machine, started as on a real cluster: a head
node (``ray start --head``) and nodes joined to it (``ray start --address``, or ``shardkit serve``),
each in a process group of its own, with token authentication.

Every Ray driver a test runs should be a subprocess given :attr:`Cluster.env`: Ray keeps
per-process state (the cluster it is connected to, the auth token it loaded) that other test
modules' local clusters would otherwise share. The cluster is stopped by killing the process
groups started here, never with ``ray stop`` (which stops every Ray process of the machine).
Test modules start one per module (a module-scoped fixture around :func:`ray_cluster`).
"""

from __future__ import annotations

import contextlib
import functools
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this interpreter
SERVE = [sys.executable, "-m", "shardkit", "serve"]  # `shardkit serve` of this interpreter

#: Waits for ``argv[2]`` nodes, then prints [{id, node manager port, "sk_" resources}] (the probe's driver).
_PROBE = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < int(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps([[n["NodeID"], n["NodeManagerPort"], sorted(k for k in n["Resources"] if k.startswith("sk_"))]
                  for n in ray.nodes() if n["Alive"]]))
"""


#: Tries to start a node: a port chosen free can still be bound by another process before the node binds it.
_STARTS = 3


def _ports(manager: int) -> list[str]:
    """Every port a node opens, chosen free: other Ray clusters may run on this machine too."""
    return ["--node-manager-port", str(manager), "--object-manager-port", str(free_port()),
            "--metrics-export-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port())]


def _said_started(log: Path) -> bool:
    """A joining node said it started: nodes started at once on a busy 2-core machine time out
    registering with the head, so the next one waits for this."""
    return "Ray runtime started" in log.read_text(errors="replace")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(ready: Callable[[Path], bool], proc: subprocess.Popen[bytes], log: Path, *, timeout: float) -> bool:
    """Wait until ``ready(log)``; False where ``proc`` exited first. A node still starting at the
    deadline is a failure of the cluster, not a retry."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if ready(log):
            return True
        if time.monotonic() > deadline:
            raise AssertionError(f"{log.stem}: no start in {timeout:.0f} s: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)
    return False


@dataclass
class Node:
    """One node: its ``ray start`` process (the leader of its process group) and Ray node id."""

    proc: subprocess.Popen[bytes]
    manager_port: int
    node_id: str = ""
    tags: list[str] = field(default_factory=list)  # its "sk_" resources

    def kill(self) -> None:
        """Kill the whole node at once (raylet, object store, workers), as a lost machine."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # what a process needs to join or drive this cluster
    nodes: list[Node]  # the head first

    @property
    def roles(self) -> dict[str, str]:
        """Node id -> its "sk_" resources joined by "+" (e.g. "sk_head")."""
        return {n.node_id: "+".join(n.tags) for n in self.nodes}


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
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


def left(procs: Sequence[subprocess.Popen[bytes]], wait: float = 10.0) -> list[int]:
    """The process groups of ``procs`` with a process left (killed ones take a moment to be reaped)."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for proc in procs:
            try:
                os.killpg(proc.pid, 0)
                alive.append(proc.pid)
            except ProcessLookupError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@contextlib.contextmanager
def ray_cluster(head: Sequence[str] = ("--num-cpus", "1"), workers: Sequence[Sequence[str]] = (("--num-cpus", "1"),),
                *, serve: bool = False, env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A head node and one node per entry of ``workers``, each started with its extra ``ray start``
    options; ``serve``: the nodes are started with ``shardkit serve --address`` (the options then
    follow its ``--``). ``env``: extra environment of every node and driver (e.g. Ray's health
    check period). Asserts on exit that no process of the cluster is left."""
    temp = tempfile.mkdtemp(prefix="skray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    token = Path(temp) / "token"
    token.write_text(secrets.token_hex(32))
    environ = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
                   RAY_USAGE_STATS_ENABLED="0", **(env or {}),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    environ.pop("RAY_ADDRESS", None)
    common = ["--object-store-memory", str(80 << 20), "--temp-dir", temp]
    nodes: list[Node] = []

    def start(command: Callable[[], list[str]], name: str, ready: Callable[[Path], bool], timeout: float) -> None:
        """Start a node and wait until ``ready(its log)``; a node that exits before (a port it was
        given was taken meanwhile) is started again on other ports, its log kept beside."""
        for attempt in range(1, _STARTS + 1):
            manager, log = free_port(), Path(temp) / f"{name}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen([*command(), *common, *_ports(manager)], env=environ, cwd=ROOT, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            nodes.append(Node(proc, manager))
            if _wait(ready, proc, log, timeout=timeout):
                return
            nodes.pop()
            _stop([proc])
            said = log.read_text(errors="replace")[-2000:]
            log.rename(log.with_suffix(f".{attempt}"))
        raise AssertionError(f"the {name} node exited {_STARTS} times before it started (exit code "
                             f"{proc.returncode}); the last said: {said}")

    port = 0

    def head_command() -> list[str]:
        nonlocal port
        port = free_port()  # another at every start
        return [*RAY, "start", "--block", "--disable-usage-stats", "--head", "--port", str(port),
                "--include-dashboard", "false", *head]

    try:
        # a node started earlier backs off for long: the head's port is waited for up to 60 s
        start(head_command, "head", lambda _: _listening(port), timeout=60)
        address = f"127.0.0.1:{port}"
        for i, extra in enumerate(workers):
            command = ([*SERVE, "--address", address, *extra, "--"] if serve
                       else [*RAY, "start", "--block", "--disable-usage-stats", "--address", address, *extra])
            start(functools.partial(list, command), f"worker{i}", _said_started, timeout=90)
        probe = subprocess.run([sys.executable, "-c", _PROBE, address, str(len(nodes))], env=environ, cwd=ROOT,
                               capture_output=True, text=True, timeout=90)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in Path(temp).glob("*.log")}
        assert probe.returncode == 0, (probe.stderr[-3000:], logs)
        found = {int(port): (node_id, tags) for node_id, port, tags in json.loads(probe.stdout)}
        assert sorted(found) == sorted(n.manager_port for n in nodes), (found, logs)
        for node in nodes:
            node.node_id, node.tags = found[node.manager_port]
        yield Cluster(address, environ, nodes)
    finally:
        _stop([n.proc for n in nodes])
        shutil.rmtree(temp, ignore_errors=True)
    assert not left([n.proc for n in nodes]), "processes of the Ray cluster are still running"
