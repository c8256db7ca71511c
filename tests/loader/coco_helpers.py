"""Shared by the COCO GPU-route tests: packed COCO sets, the route forced onto the CPU, and the
agreement check against the CPU route."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sample_data.coco_gen import make_coco
from shardkit import ShardLoader, transforms
from shardkit.loader import loader as loader_module
from shardkit.loader.routes import choose as routing
from shardkit.loader.routes.coco import PaddedImages
from shardkit.loader.routes.coco_gpu import CocoGpuRoute
from shardkit.loader.routes.gpu import GpuOptions
from shardkit.loader.routes.spec import RouteSpec
from shardkit.pack import PackOptions, pack_coco

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "coco"
TRANSFORMS: dict[str, Callable[[], Any]] = {
    "train": lambda: transforms.detection_train((64, 96), 128),
    "jitter": lambda: transforms.detection_train(96, 128, scale_jitter=(0.3, 1.5)),
    "no-crop": lambda: transforms.detection_train(80, 120, iou_crop=False, flip_p=1.0),
    "val": lambda: transforms.detection_val(64, 128),
    "none": lambda: None,
}


def make_packed_cocos(root: Path) -> dict[str, Path]:
    """``name -> packed dataset``: the shipped photos, and a generated set (PNGs, crowd RLE, empty images)."""
    generated = make_coco(root / "gen", images=14, seed=3)
    out = {}
    for name, (images, ann) in {"sample": (SAMPLE / "images", SAMPLE / "instances.json"),
                                "generated": generated}.items():
        pack_coco(str(images), str(ann), str(root / name), options=PackOptions(max_count=6), workers=1)
        out[name] = root / name
    return out


def gpu_route_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[CocoGpuRoute]:
    """Make ShardLoader take the COCO GPU route on the CPU (its stages in the calling thread);
    returns the list the routes made from now on are appended to."""
    real, made = routing.choose_route, list[CocoGpuRoute]()

    def choose(manifest: Any, reader: Any, spec: RouteSpec) -> Any:
        if manifest.kind != "coco":
            return real(manifest, reader, spec)
        made.append(CocoGpuRoute(manifest, reader, spec.transform, device=spec.device, on_error=spec.on_error,
                                 batch_size=spec.batch_size, num_workers=spec.num_workers, prefetch=spec.prefetch,
                                 options=spec.gpu, masks=spec.masks, pad=spec.pad,
                                 contiguous_labels=spec.contiguous_labels))
        return made[-1]

    monkeypatch.setattr(loader_module, "choose_route", choose)
    return made


def run(ds: Path, transform: Any, **kw: Any) -> list[tuple[Any, list[dict[str, Any]], list[str]]]:
    kw = {"gpu": GpuOptions(compile=False), **kw}
    loader = ShardLoader(str(ds), batch_size=4, transform=transform, keys=True, seed=13, **kw)
    return [(images, targets, keys) for images, targets, keys in loader]


def image_list(images: Any) -> list[torch.Tensor]:
    if isinstance(images, PaddedImages):
        return [im[:, :h, :w] for im, (h, w) in zip(images.images, images.sizes.tolist(), strict=True)]
    return list(images)


def assert_agree(cpu: list[Any], gpu: list[Any], *, pixel_tol: int = 1,
                 image_check: Callable[[torch.Tensor], None] | None = None) -> float:
    """Same batches, keys and targets (bit for bit); pixels within ``pixel_tol`` of each other
    (or, with ``image_check``, that function of the absolute difference passes). Returns the
    worst mean absolute difference of an image."""
    assert len(cpu) == len(gpu)
    worst = 0.0
    for (ci, ct, ck), (gi, gt, gk) in zip(cpu, gpu, strict=True):
        assert ck == gk and type(ci) is type(gi)
        if isinstance(ci, PaddedImages):
            assert ci.images.shape == gi.images.shape and torch.equal(ci.sizes.cpu(), gi.sizes.cpu())
            pad_c, pad_g = ci.images.cpu().clone(), gi.images.cpu().clone()
            for i, (h, w) in enumerate(ci.sizes.tolist()):
                pad_c[i, :, :h, :w] = pad_g[i, :, :h, :w] = 0
            assert int(pad_g.sum()) == 0  # padding is zero on both
        for a, b in zip(image_list(ci), image_list(gi), strict=True):
            assert a.shape == b.shape and b.dtype == torch.uint8
            diff = (a.cpu().int() - b.cpu().int()).abs()  # either side may be on the GPU
            if image_check is not None:
                image_check(diff)
            else:
                assert int(diff.max()) <= pixel_tol, int(diff.max())
            worst = max(worst, float(diff.float().mean()))
        for a, b in zip(ct, gt, strict=True):
            assert list(a) == list(b) and a["image_id"] == b["image_id"]
            for k in a:
                if isinstance(a[k], torch.Tensor):
                    assert a[k].dtype == b[k].dtype and torch.equal(a[k].cpu(), b[k].cpu()), k
    return worst
