"""The whole service cluster stopped mid-epoch (a cluster of its own: a head node with no CPUs and a
``shardkit serve`` node): the training loop gets a LoaderError saying so, at once, and can still
write its checkpoint; and Ray does not end the process a minute later, as it does with a driver
left connected to a cluster whose head node is gone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.raycluster import ROOT, Cluster, ray_cluster

pytest.importorskip("ray", reason="ray is not installed (pip install 'shardkit[ray]')")

#: Longer than the minute after which Ray's GCS client ends a driver whose cluster is gone.
LINGER_S = 70.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ray_cluster(head=("--num-cpus", "0"), workers=[("--num-cpus", "2")], serve=True) as started:
        yield started


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cluster_stopped_mid_epoch_is_a_loader_error_and_the_process_lives_on(cluster: Cluster, packed: Path,
                                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    groups = ",".join(str(node.proc.pid) for node in reversed(cluster.nodes))  # the CPU node, then the head
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tests.loader.service.drive", str(out), cluster.address, str(packed),
                           "--slow", "--after", "2", "--kill-group", groups, "--linger", str(LINGER_S)],
                          env=cluster.env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    took = time.monotonic() - began
    for node in cluster.nodes:
        node.proc.wait()
    assert done.returncode == 0, done.stderr[-3000:]  # alive after the linger: Ray did not end it
    got: dict[str, Any] = torch.load(out, weights_only=False)
    assert got["error"].startswith("the service's Ray cluster is gone (its head node's GCS at ")
    assert "refuses connections" in got["error"] and "resume from the loader's state_dict()" in got["error"]
    assert len(got["batches"]) >= 2 and got["state"]["batches_consumed"] == len(got["batches"])
    assert got["connected"] is False  # and close() started no local Ray in its place
    assert got["again"].startswith("cannot reach the Ray cluster at ")  # not served by a local cluster
    assert took < LINGER_S + 45, took  # the error came at once, not after start_timeout_s (60 s here)
