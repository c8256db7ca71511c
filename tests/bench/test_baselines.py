"""The baselines produce what ShardLoader produces: uint8 [B,3,S,S] batches and int64 labels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardkit.bench import baselines
from shardkit.pack import PackOptions, pack


@pytest.mark.parametrize("train", [True, False])
def test_imagefolder_loader_batches(tiny_tree: Path, train: bool) -> None:
    loader = baselines.imagefolder_loader(str(tiny_tree), size=32, train=train, batch_size=5,
                                          workers=0)
    batches = list(loader)
    assert len(batches) == 24 // 5  # drop_last
    images, labels = batches[0]
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64


def test_webdataset_loader_reads_our_shards(tiny_tree: Path, tmp_path: Path) -> None:
    result = pack(str(tiny_tree), str(tmp_path / "ds"), options=PackOptions(max_count=6), workers=1)
    urls = [str(tmp_path / "ds" / s.url) for s in result.manifest.shards]
    batches = list(baselines.webdataset_loader(urls, size=32, train=True, batch_size=4, workers=0))
    assert len(batches) == 6
    images, labels = batches[0]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == [0] * 12 + [1] * 12


def test_val_transform_matches_preset_sizes() -> None:
    t = baselines.torchvision_transform(224, train=False)
    assert [type(s).__name__ for s in t.transforms] == ["Resize", "CenterCrop", "PILToTensor"]


def test_webdataset_loader_rebatches_what_workers_with_less_than_a_batch_read(tiny_tree: Path, tmp_path: Path) -> None:
    """12 shards of 2 images for 4 workers: each reads 6, less than a batch of 8, and batching in
    the workers alone gave no batch at all (the bench then failed after timing the others). With
    ``rebatch`` the WebLoader regroups the workers' partial batches: 24 // 8 full batches."""
    result = pack(str(tiny_tree), str(tmp_path / "ds"), options=PackOptions(max_count=2), workers=1)
    urls = [str(tmp_path / "ds" / s.url) for s in result.manifest.shards]
    assert list(baselines.webdataset_loader(urls, size=16, train=False, batch_size=8, workers=4)) == []
    loader = baselines.webdataset_loader(urls, size=16, train=False, batch_size=8, workers=4, rebatch=True)
    for _epoch in range(2):
        batches = list(loader)
        assert [tuple(b[0].shape) for b in batches] == [(8, 3, 16, 16)] * 3
        assert all(b[1].dtype == torch.int64 for b in batches)
        assert sorted(torch.cat([b[1] for b in batches]).tolist()) == [0] * 12 + [1] * 12
