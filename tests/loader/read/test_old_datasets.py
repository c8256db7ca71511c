"""A dataset written before the shard table existed (index.json alone) loads as one with it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from shardkit import ShardLoader, transforms
from shardkit.index.manifest_io import read_manifest
from shardkit.storage import Store


def test_a_dataset_without_a_table_gives_the_same_batches(packed: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(packed, old)
    manifest = read_manifest(Store(str(old)))
    (old / "index.json").write_bytes(manifest.to_json())  # as written before the table: no reference
    (old / "index.table").unlink()
    (old / "index.hashes").unlink()
    common: dict[str, Any] = {"batch_size": 8, "transform": transforms.imagenet_train(32), "keys": True, "seed": 3}
    with ShardLoader(str(packed), **common) as new_loader, ShardLoader(str(old), **common) as old_loader:
        assert old_loader.manifest == new_loader.manifest
        new, got = list(new_loader), list(old_loader)
        state = new_loader.state_dict()
        old_loader.load_state_dict(state)  # the same identity, from index.json's hashes
    assert [k for *_, k in got] == [k for *_, k in new]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, new, strict=True))
