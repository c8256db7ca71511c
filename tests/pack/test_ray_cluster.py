"""Packing on a real two-node Ray cluster started on this machine with ``ray start``, as on a real
cluster: a head node and a second node joined to it (1 CPU each, so that tasks must spread),
a remote source and a remote destination (S3 on the moto server). Shards are written on both
nodes (the pack reports the node of every shard) and are byte-identical to the process pool's.

The cluster (:mod:`tests.raycluster`) starts once for the module; every Ray driver
(``shardkit pack --ray``) runs in a subprocess.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkit.pack import PackOptions, pack
from shardkit.storage import Store
from tests.conftest import upload_tree
from tests.raycluster import ROOT, Cluster, ray_cluster

pytest.importorskip("ray", reason="ray is not installed (pip install 'shardkit[ray]')")

OPTIONS = PackOptions(max_count=2, seed=1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ray_cluster(head=("--num-cpus", "1", "--resources", '{"sk_head": 1}'),
                     workers=[("--num-cpus", "1", "--resources", '{"sk_worker": 1}')]) as started:
        assert sorted(started.roles.values()) == ["sk_head", "sk_worker"], started.roles
        yield started


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

    # SPREAD, the pack's placement, is a preference: on a busy 2-core machine the second node can
    # miss one pack's six tasks (seen once in five runs). Each pack must equal the process pool's;
    # one of three must use both nodes.
    lines = []
    for attempt in range(3):
        done = _cli(cluster, src, f"{s3_bucket}/ray{attempt}", options=s3_server)
        assert done.returncode == 0, done.stderr
        assert _objects(f"{s3_bucket}/ray{attempt}", s3_server) == _objects(f"{s3_bucket}/processes", s3_server)
        # "ray       6 shards written on 2 nodes (3 on 1a2b3c4d, 3 on 5e6f7a8b)"
        [line] = [line for line in done.stdout.splitlines() if line.startswith("ray ")]
        lines.append(line)
        if "6 shards written on 2 nodes" in line:
            break
    assert "6 shards written on 2 nodes" in line, lines
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


@pytest.mark.timeout(120)
def test_a_cluster_that_wants_a_token_is_said_so_before_dst_is_made(cluster: Cluster, small_tree: Path,
                                                                   tmp_path: Path) -> None:
    """A driver without the cluster's token: one line saying what to set, and no DST (Ray's
    GCS client retries for about 20 s first)."""
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    dst = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "shardkit", "pack", str(small_tree), str(dst),
                           f"--ray={cluster.address}"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot connect to the Ray cluster at {cluster.address} (the cluster uses token "
        "authentication and refused this process: set RAY_AUTH_MODE=token and make the cluster's token readable "
        "here (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN))")
    assert not dst.exists()
