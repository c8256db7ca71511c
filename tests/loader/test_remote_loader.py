"""ShardLoader over S3 (a real moto server on 127.0.0.1): same batches as from local disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shardkit import ShardLoader, transforms
from shardkit.pack import PackOptions, pack


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
