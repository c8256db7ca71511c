"""The GPU route's last resort for images neither nvJPEG nor the CPU decodes: the same bad-sample
policy as every route (replace and count, or raise naming the sample). Runs on the CPU: the
pipeline's rescue step is plain torch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardkit import LoaderError, transforms
from shardkit.loader.routes.gpu.host import GpuPipeline
from shardkit.loader.routes.gpu.worker import RawBatch
from tests.loader.gpu_helpers import make_packed_imagenet_like, raw_and_cpu_streams, staged


@pytest.fixture(scope="module")
def inet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("inet_rescue"))


def _first(inet: Path, *, all_jpeg: bool = False) -> RawBatch:
    """The first worker batch of the GPU route (``all_jpeg``: the first with no CPU-decoded image)."""
    _, raw = raw_and_cpu_streams(inet, transforms.imagenet_val(32), batch_size=8)
    return next(b for b in raw if not (all_jpeg and b.images.m))


def _rescue(inet: Path, on_error: str, spoil: list[int], *, all_jpeg: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, list[str], int]:
    """Run the rescue on one worker batch whose JPEGs ``spoil`` nvJPEG "rejected" and that are
    not images at all (zeroed bytes)."""
    t = transforms.imagenet_val(32)
    batch = _first(inet, all_jpeg=all_jpeg)
    images = batch.images
    for i in spoil:
        images.jpegs()[i].zero_()
    out = torch.zeros((len(images), 3, 32, 32), dtype=torch.uint8)
    labels = images.labels.clone()
    GpuPipeline(t, torch.device("cpu"), compile=False, on_error=on_error)._cpu_rescue(
        staged(batch), spoil, out, labels, batch)
    return out, labels, batch.keys, batch.stats.replaced


def test_undecodable_images_are_replaced_by_a_neighbour_and_counted(inet: Path) -> None:
    first = _first(inet)
    dests = [int(d) for d in first.images.geometry[:, -1].tolist()]
    out, labels, keys, replaced = _rescue(inet, "replace", [0])
    bad = dests[0]
    assert replaced == 1 and keys[bad] != first.keys[bad] and keys[bad] in first.keys
    src = first.keys.index(keys[bad])
    assert torch.equal(out[bad], out[src]) and labels[bad] == labels[src]


def test_on_error_raise_names_the_sample(inet: Path) -> None:
    first = _first(inet)
    bad = int(first.images.geometry[0, -1])
    with pytest.raises(LoaderError, match=f"bad sample \\({first.keys[bad]}: neither nvJPEG nor the CPU"):
        _rescue(inet, "raise", [0])


def test_a_batch_with_no_decodable_image_is_an_error_not_an_index_error(inet: Path) -> None:
    batch = _first(inet, all_jpeg=True)  # (CPU-decoded images of a batch would stay good)
    with pytest.raises(LoaderError, match="every image of a batch is undecodable"):
        _rescue(inet, "replace", list(range(batch.images.k)), all_jpeg=True)
