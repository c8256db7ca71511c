"""The COCO GPU route on a CUDA device: chosen for ``device="cuda"``; the same samples and targets
as the CPU route (bit for bit: boxes, labels, area, iscrowd, masks), pixels within tolerance;
the device stage equal to the eager reference on nvJPEG's pixels, compiled and eager; padded
batches; exact resume; batches safe on a user stream.

Tolerance, as for classification (tests/loader/routes/test_gpu_cuda.py): nvJPEG and libjpeg-turbo
differ in IDCT and chroma upsampling, so per image the mean absolute difference stays under
``MEAN_TOL`` levels and fewer than ``FRAC_TOL`` of values differ by more than ``BIG``; given the
same decoded pixels the device stage equals the reference within one level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import ShardLoader, transforms
from shardkit.codec.nvjpeg import GpuJpegDecoder
from shardkit.loader import GpuOptions
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.coco_gpu import CocoGpuRoute
from shardkit.loader.routes.coco_gpu.host import DetectionPipeline
from shardkit.loader.routes.coco_gpu.worker import RawDetectionBatch, RawDetectionBuilder
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.run.stream import BatchStream, raise_failures
from shardkit.transforms.gpu import GEOMETRY_COLUMNS
from tests.loader.coco_helpers import TRANSFORMS, assert_agree, image_list, make_packed_cocos

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MEAN_TOL, BIG, FRAC_TOL = 3.0, 16, 0.01


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_packed_cocos(tmp_path_factory.mktemp("coco_gpu_cuda"))


def _run(ds: Path, device: str, transform: Any, **kw: Any) -> list[tuple[Any, list[dict[str, Any]], list[str]]]:
    loader = ShardLoader(str(ds), batch_size=4, transform=transform, device=device, keys=True, seed=7, **kw)
    if device == "cuda":
        assert isinstance(loader.route, CocoGpuRoute)
    out = [(images, targets, keys) for images, targets, keys in loader]
    loader.close()
    return out


def _within_tolerance(diff: torch.Tensor) -> None:
    d = diff.float()
    assert d.mean() <= MEAN_TOL and (d > BIG).float().mean() <= FRAC_TOL, (float(d.mean()), float(d.max()))


@pytest.mark.parametrize("name", ["sample", "generated"])
@pytest.mark.parametrize("kind", ["train", "jitter", "val", "none"])
def test_gpu_route_matches_the_cpu_route(coco: dict[str, Path], name: str, kind: str) -> None:
    cpu = _run(coco[name], "cpu", TRANSFORMS[kind](), num_workers=2)
    gpu = _run(coco[name], "cuda", TRANSFORMS[kind](), num_workers=2)
    for _, targets, _ in gpu:
        for t in targets:
            assert t["boxes"].device.type == "cuda"
    worst = assert_agree(cpu, gpu, image_check=_within_tolerance)
    print(f"{name}/{kind}: worst per-image mean abs diff GPU vs CPU route: {worst:.3f}")


@pytest.mark.parametrize("pad", [False, 32])
def test_masks_padding_and_labels_match_the_cpu_route(coco: dict[str, Path], pad: bool | int) -> None:
    pytest.importorskip("pycocotools")
    kw: dict[str, Any] = {"masks": True, "pad": pad, "contiguous_labels": True, "num_workers": 2}
    for name in ("generated", "sample"):
        t = transforms.detection_train((64, 96), 128)
        cpu = _run(coco[name], "cpu", t, **kw)
        gpu = _run(coco[name], "cuda", t, **kw)
        assert_agree(cpu, gpu, image_check=_within_tolerance)  # masks: torch.equal, resized by nearest on CUDA


def _raw_batches(ds: Path, transform: Any) -> list[RawDetectionBatch]:
    loader = ShardLoader(str(ds), batch_size=4, transform=transform, seed=7)
    reader = ShardReader(loader.reader.store, loader.manifest.shards)
    stream = BatchStream(loader.config, RawDetectionBuilder(reader, transform), torch.tensor([0, 0]))
    return list(raise_failures(stream))


@pytest.mark.parametrize("compile", [True, False])
@pytest.mark.parametrize("pad", [0, 32])
def test_device_stage_equals_the_reference_on_nvjpeg_pixels(coco: dict[str, Path], compile: bool, pad: int) -> None:
    t = transforms.detection_train(800, 1333)
    dev = torch.device("cuda")
    nvjpeg = GpuJpegDecoder(dev)
    ref = DetectionPipeline(torch.device("cpu"), pad=pad, compile=False)
    ref.decoder.decode = lambda datas: [im.cpu() for im in nvjpeg.decode(datas)]  # type: ignore[method-assign]
    pipe = DetectionPipeline(dev, pad=pad, compile=compile)
    slot, ref_slot = PinnedSlot(4, (0, 0), len(GEOMETRY_COLUMNS), pin=True), \
        PinnedSlot(4, (0, 0), len(GEOMETRY_COLUMNS), pin=False)
    for name in ("sample", "generated"):
        for batch in _raw_batches(coco[name], t):
            ref_slot.stage(batch)
            want = ref(batch, ref_slot)
            slot.stage(batch)
            got = pipe(batch, slot)
            torch.cuda.synchronize()
            for a, b in zip(image_list(want.images), image_list(got.images), strict=True):
                assert a.shape == b.shape and (a.int() - b.cpu().int()).abs().max() <= 1


def test_eager_and_compiled_agree_end_to_end(coco: dict[str, Path]) -> None:
    t = transforms.detection_train(800, 1333)
    a = _run(coco["sample"], "cuda", t, gpu=GpuOptions(compile=True), num_workers=2)
    b = _run(coco["sample"], "cuda", t, gpu=GpuOptions(compile=False), num_workers=3)
    assert_agree(a, b, pixel_tol=1)


def test_resume_stats_and_user_stream(coco: dict[str, Path]) -> None:
    t = transforms.detection_train((480, 640), 800)
    ds = coco["generated"]
    full = ShardLoader(str(ds), batch_size=3, transform=t, device="cuda", keys=True, seed=3, num_workers=2)
    ref = [([im.cpu() for im in x], [tg["boxes"].cpu() for tg in y], k) for x, y, k in full]
    s = full.stats
    assert s.gpu_images > 0 and s.gpu_fallback > 0 and s.gpu_images + s.gpu_fallback == s.samples
    part = ShardLoader(str(ds), batch_size=3, transform=t, device="cuda", keys=True, seed=3, num_workers=1)
    it = iter(part)
    next(it), next(it)
    state = part.state_dict()
    del it
    part.close()
    again = ShardLoader(str(ds), batch_size=3, transform=t, device="cuda", keys=True, seed=3, num_workers=3)
    again.load_state_dict(state)
    stream = torch.cuda.Stream()
    rest = []
    with torch.cuda.stream(stream):  # consumed on a user stream: the prefetcher's event and record_stream
        for x, y, k in again:
            rest.append(([(im.float() * 1).to(torch.uint8).cpu() for im in x], [tg["boxes"].cpu() for tg in y], k))
    assert [k for *_, k in rest] == [k for *_, k in ref[2:]]
    for (xa, ba, _), (xb, bb, _) in zip(ref[2:], rest, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(xa, xb, strict=True))
        assert all(torch.equal(p, q) for p, q in zip(ba, bb, strict=True))
    full.close()
    again.close()
