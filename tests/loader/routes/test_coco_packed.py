"""Detection batches packed for the trip between processes unpack to what went in: values,
dtypes, strides of HWC images, images without boxes, masks; and they are few tensors."""

from __future__ import annotations

import pickle

import torch

from shardkit.loader.routes.coco.packed import PackedPlanes, PackedTargets


def test_planes_round_trip_keeps_values_and_memory_order() -> None:
    g = torch.Generator().manual_seed(0)
    chw = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=g)
    hwc = torch.randint(0, 256, (6, 4, 3), dtype=torch.uint8, generator=g).permute(2, 0, 1)  # channels-last
    masks = torch.randint(0, 2, (2, 5, 7), dtype=torch.uint8, generator=g)
    none = torch.zeros((0, 5, 7), dtype=torch.uint8)
    packed = pickle.loads(pickle.dumps(PackedPlanes.of([chw, hwc, masks, none])))
    got = packed.unpack()
    assert [tuple(t.shape) for t in got] == [(3, 5, 7), (3, 6, 4), (2, 5, 7), (0, 5, 7)]
    assert all(torch.equal(a, b) for a, b in zip(got, [chw, hwc, masks, none], strict=True))
    assert got[1].stride() == hwc.stride() and got[0].is_contiguous()
    assert all(t.untyped_storage().data_ptr() == packed.data.untyped_storage().data_ptr() for t in got)


def test_targets_round_trip_with_empty_images_and_masks() -> None:
    def target(image_id: object, n: int) -> dict[str, object]:
        return {"image_id": image_id, "boxes": torch.arange(4 * n, dtype=torch.float32).reshape(n, 4),
                "labels": torch.arange(n), "area": torch.full((n,), 2.5), "iscrowd": torch.zeros(n, dtype=torch.int64),
                "masks": torch.ones((n, 3, 4), dtype=torch.uint8)}

    targets = [target(1, 2), target("b", 0), target(3, 3)]
    packed = pickle.loads(pickle.dumps(PackedTargets.of(targets, masks=True)))
    got = packed.unpack()
    for a, b in zip(targets, got, strict=True):
        assert list(a) == list(b) and a["image_id"] == b["image_id"]
        for k, v in a.items():
            if isinstance(v, torch.Tensor):
                assert isinstance(b[k], torch.Tensor) and b[k].dtype == v.dtype and torch.equal(b[k], v), k
    assert PackedTargets.of([]).unpack() == []
    assert "masks" not in PackedTargets.of(targets).unpack()[0]
