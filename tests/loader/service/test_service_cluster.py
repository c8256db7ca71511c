"""The preprocessing service on a real Ray cluster of three node processes on this machine: a head
node with no CPUs and two CPU nodes started with ``shardkit serve`` (1 CPU each, so the service's
two workers run one per node). Each training process is a subprocess
(:mod:`tests.loader.service.drive`); the batches it delivers are compared tensor by tensor with
those of the same loader with two local worker processes.

The node test kills a node: it runs last and leaves the cluster with one CPU node.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.loader.service.drive import loader
from tests.raycluster import ROOT, Cluster, ray_cluster

pytest.importorskip("ray", reason="ray is not installed (pip install 'shardkit[ray]')")

#: Node deaths noticed in about a second rather than Ray's default 15 or more.
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "2",
                      "RAY_health_check_timeout_ms": "1000"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ray_cluster(head=("--num-cpus", "0"), workers=[("--num-cpus", "1")] * 2, serve=True,
                     env=FAST_HEALTH_CHECKS) as started:
        yield started


def _drive(cluster: Cluster, tmp_path: Path, dataset: Path | str, *args: str, name: str = "out",
           address: str | None = None, expect_kill: bool = False) -> dict[str, Any]:
    out = tmp_path / f"{name}.pt"
    done = subprocess.run([sys.executable, "-m", "tests.loader.service.drive", str(out),
                           address or cluster.address, str(dataset), *args],
                          env=cluster.env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    if expect_kill:
        assert done.returncode == -9, done.stderr[-3000:]
        return {}
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


@pytest.fixture(scope="module")
def local(packed: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The batches of the same loaders with two local worker processes: ``"fast"``, two epochs of
    ``transforms.imagenet_train``, and ``"slow"``, one epoch of :class:`SlowCrop`."""
    out: dict[str, list[tuple[Any, ...]]] = {"fast": [], "slow": []}
    for name, epochs in (("fast", 2), ("slow", 1)):
        with loader(str(packed), name == "slow", num_workers=2) as made:
            for epoch in range(epochs):
                made.set_epoch(epoch)
                out[name] += [(epoch, *batch) for batch in made]
    return out


def _assert_same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for i, ((e1, x1, y1, k1), (e2, x2, y2, k2)) in enumerate(zip(got, want, strict=True)):
        assert (e1, k1) == (e2, k2), i
        assert x1.dtype == torch.uint8 and torch.equal(x1, x2), i
        assert torch.equal(y1, y2), i


@pytest.mark.timeout(300)
def test_the_service_delivers_the_batches_of_local_workers(cluster: Cluster, packed: Path, tmp_path: Path,
                                                           local: dict[str, list[Any]]) -> None:
    got = _drive(cluster, tmp_path, packed, "--epochs", "2")
    _assert_same(got["batches"], local["fast"])
    cpu_nodes = {n.node_id for n in cluster.nodes[1:]}
    assert set(got["nodes"]) == cpu_nodes, "both CPU nodes build batches, the head (no CPUs) none"
    assert sum(got["nodes"].values()) == len(got["batches"]) and got["restarts"] == 0


@pytest.mark.timeout(300)
def test_a_killed_worker_s_batches_are_built_elsewhere(cluster: Cluster, packed: Path, tmp_path: Path,
                                                       local: dict[str, list[Any]]) -> None:
    got = _drive(cluster, tmp_path, packed, "--slow", "--kill-actor", "--after", "2")
    _assert_same(got["batches"], local["slow"])
    assert got["restarts"] == 1 and got["killed"]["pid"] not in got["workers"]


@pytest.mark.timeout(300)
def test_a_killed_trainer_resumes_with_exactly_the_remaining_batches(cluster: Cluster, packed: Path, tmp_path: Path,
                                                                   local: dict[str, list[Any]]) -> None:
    state = tmp_path / "state.json"
    _drive(cluster, tmp_path, packed, "--stop", str(state), "--after", "4", name="killed", expect_kill=True)
    # Its workers die with it (Ray stops the actors of a dead driver): the new ones need their CPUs.
    got = _drive(cluster, tmp_path, packed, "--resume", str(state), name="resumed")
    _assert_same(got["batches"], [b for b in local["fast"] if b[0] == 0][4:])


@pytest.mark.timeout(300)
def test_a_dataset_the_nodes_cannot_read_is_named_before_any_batch(cluster: Cluster, packed: Path,
                                                                   tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(packed, broken)
    # The training process checks the shards' files; their offsets files are read where the
    # samples are (the nodes'), so a damaged one is what only the nodes can find.
    first = sorted(broken.glob("*.idx"))[0]
    first.write_text("not an offsets file\n")
    got = _drive(cluster, tmp_path, broken)
    assert got["error"].startswith("the service worker on node "), got
    assert f"cannot read the dataset here: {first}: " in got["error"], got


@pytest.mark.timeout(300)
def test_a_node_killed_mid_epoch_loses_nothing(cluster: Cluster, packed: Path, tmp_path: Path,
                                              local: dict[str, list[Any]]) -> None:
    victim = cluster.nodes[2]
    got = _drive(cluster, tmp_path, packed, "--slow", "--kill-group", str(victim.proc.pid), "--after", "2")
    victim.proc.wait()
    _assert_same(got["batches"], local["slow"])
    assert got["restarts"] >= 1
    assert victim.node_id in got["nodes"], "the node built batches before it was lost"
