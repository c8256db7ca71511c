"""ShardLoader over S3 (a real moto server on 127.0.0.1): same batches as from local disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

from shardkit import ShardLoader, transforms
from shardkit.pack import PackOptions, pack
from tests.cli.terminal import ROOT
from tests.conftest import upload_tree
from tests.keepalive import KeepAliveProxy


def test_s3_dataset_streams_like_the_local_copy(indexed_tree: Path, packed: Path, s3_server: dict[str, Any],
                                                s3_bucket: str, tmp_path: Path) -> None:
    url = f"{s3_bucket}/ds"
    pack(str(indexed_tree), url, options=PackOptions(max_count=10, seed=1), workers=1, storage_options=s3_server)
    common: dict[str, Any] = {"batch_size": 8, "transform": transforms.imagenet_train(32), "keys": True, "seed": 4}
    local = [(x, k) for x, _, k in ShardLoader(str(packed), **common)]
    with ShardLoader(url, num_workers=2, storage_options=s3_server, cache_dir=str(tmp_path / "cache"),
                     **common) as remote:
        got = [(x, k) for x, _, k in remote]
    assert [k for _, k in got] == [k for _, k in local]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, local, strict=True))
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.tar"))
    assert len(cached) == 7  # each shard fetched once into the node's cache, named by its sha256


# A load over S3 with workers, run as its own process so that its stderr is what a user sees.
# The transform makes one garbage collection run in fsspec's IO thread of each worker, where a
# long load's collections often land (that thread allocates for every download): it frees the
# filesystem the worker inherited from the main process.
LOAD_WITH_WORKERS = """
import gc, json, os, sys, time
from fsspec.asyn import get_loop, sync
from shardkit import ShardLoader

collected = set()

async def collect():
    gc.collect()

def collect_in_io_thread(image):
    if os.getpid() not in collected:
        collected.add(os.getpid())
        sync(get_loop(), collect)
        time.sleep(0.3)
        gc.collect()
    return image

url, options, cache = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
with ShardLoader(url, batch_size=8, transform=collect_in_io_thread, num_workers=2, storage_options=options,
                 cache_dir=cache) as loader:
    print(sum(1 for _ in loader) == len(loader))
"""


def test_s3_load_with_workers_prints_nothing_on_stderr(indexed_tree: Path, s3_server: dict[str, Any],
                                                       s3_bucket: str, tmp_path: Path) -> None:
    """No "Task exception was never retrieved" from the S3 clients workers inherit; the
    main process holds a pooled connection (through a keep-alive proxy, as with real S3)."""
    url = f"{s3_bucket}/ds"
    pack(str(indexed_tree), url, options=PackOptions(max_count=10, seed=1), workers=1, storage_options=s3_server)
    endpoint = urlsplit(s3_server["client_kwargs"]["endpoint_url"])
    proxy = KeepAliveProxy((str(endpoint.hostname), int(endpoint.port or 80)))
    options = {**s3_server, "client_kwargs": {"endpoint_url": proxy.url}}
    try:
        argv = [sys.executable, "-c", LOAD_WITH_WORKERS, url, json.dumps(options), str(tmp_path / "cache")]
        done = subprocess.run(argv, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=240)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert "Task exception was never retrieved" not in done.stderr, done.stderr
    assert done.stderr == "", done.stderr


def test_a_mix_over_s3_streams_and_resumes_like_the_local_mix(indexed_tree: Path, packed: Path,
                                                              s3_server: dict[str, Any], s3_bucket: str,
                                                              tmp_path: Path) -> None:
    """Two S3 datasets mixed, read by workers from the node's cache, stopped after 3 batches and
    resumed by a fresh loader: the batches of the same mix read from local disk."""
    second = tmp_path / "b"
    pack(str(indexed_tree), str(second), options=PackOptions(max_count=7, seed=3), workers=1)
    urls = [f"{s3_bucket}/a", f"{s3_bucket}/b"]
    upload_tree(packed, urls[0], s3_server)
    upload_tree(second, urls[1], s3_server)
    common: dict[str, Any] = {"batch_size": 8, "transform": transforms.imagenet_train(32), "keys": True, "seed": 5,
                              "weights": [0.7, 0.3]}
    local = [(x, k) for x, _, k in ShardLoader([str(packed), str(second)], **common)]
    remote: dict[str, Any] = {"storage_options": s3_server, "cache_dir": str(tmp_path / "cache"), **common}
    with ShardLoader(urls, num_workers=2, **remote) as loader:
        it = iter(loader)
        head = [(x, k) for x, _, k in (next(it) for _ in range(3))]
        state = json.loads(json.dumps(loader.state_dict()))
    with ShardLoader(urls, num_workers=1, **remote) as loader:
        loader.load_state_dict(state)
        tail = [(x, k) for x, _, k in loader]
    got = head + tail
    assert [k for _, k in got] == [k for _, k in local]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, local, strict=True))
    tables = sorted(p.name for p in (tmp_path / "cache").glob("*.table"))
    assert len(tables) == 2  # each dataset's index.table, fetched for the node and kept beside its shards


def test_a_cache_dir_that_cannot_be_made_is_named(indexed_tree: Path, s3_server: dict[str, Any], s3_bucket: str,
                                                  tmp_path: Path) -> None:
    """It was the raw ``FileExistsError`` of ``os.makedirs``, naming neither the option nor why."""
    import pytest

    from shardkit.errors import StorageError

    url = f"{s3_bucket}/ds"
    pack(str(indexed_tree), url, options=PackOptions(max_count=10), workers=1, storage_options=s3_server)
    (tmp_path / "a-file").write_text("x")
    for cache, why in ((tmp_path / "a-file", "a file of that name is in the way"),
                       (tmp_path / "a-file" / "sub", "a file on its path is in the way")):
        with pytest.raises(StorageError, match=f"^{cache}: cannot make the shard cache directory here "
                                               rf"\({why}\); choose a directory you can write"):
            next(iter(ShardLoader(url, batch_size=4, storage_options=s3_server, cache_dir=str(cache))))
