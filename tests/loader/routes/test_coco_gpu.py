"""The COCO GPU route without a GPU: its device stages run on the CPU (libjpeg-turbo for nvJPEG,
the eager resize for the kernel), against the CPU route for the same seed: same keys, the same
targets bit for bit (boxes, labels, area, iscrowd, masks), pixels within one level (the
float32 resize vs torch's uint8 one); the nvJPEG rescue and replacement; the routing decision."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.routes import choose as routing
from shardkit.loader.routes.coco import CocoRoute
from shardkit.loader.routes.coco_gpu import CocoGpuRoute
from shardkit.loader.routes.coco_gpu.worker import RawDetectionBuilder
from shardkit.loader.routes.gpu import GpuOptions
from shardkit.transforms.detection import DetectionTransform
from tests.loader.coco_helpers import TRANSFORMS, assert_agree, gpu_route_on_cpu, image_list, make_packed_cocos, run


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_packed_cocos(tmp_path_factory.mktemp("coco_gpu"))


@pytest.mark.parametrize("name", ["sample", "generated"])
@pytest.mark.parametrize("kind", list(TRANSFORMS))
def test_same_batches_targets_and_pixels_as_the_cpu_route(coco: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                           name: str, kind: str) -> None:
    cpu = run(coco[name], TRANSFORMS[kind]())
    gpu_route_on_cpu(monkeypatch)
    loader = ShardLoader(str(coco[name]), batch_size=4, transform=TRANSFORMS[kind]())
    assert isinstance(loader.route, CocoGpuRoute)
    gpu = run(coco[name], TRANSFORMS[kind]())
    assert_agree(cpu, gpu)


@pytest.mark.parametrize("pad", [False, 32])
def test_masks_padding_and_contiguous_labels_agree(coco: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                   pad: bool | int) -> None:
    pytest.importorskip("pycocotools")
    kw: dict[str, Any] = {"masks": True, "pad": pad, "contiguous_labels": True}
    for name in ("generated", "sample"):
        t = transforms.detection_train((64, 96), 128)
        cpu = run(coco[name], t, **kw)
        with monkeypatch.context() as m:
            gpu_route_on_cpu(m)
            gpu = run(coco[name], t, **kw)
        assert_agree(cpu, gpu)
        assert any(len(tg["masks"]) for _, tgs, _ in gpu for tg in tgs)


def test_workers_stats_and_resume(coco: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_route_on_cpu(monkeypatch)
    t = transforms.detection_train((64, 96), 128)
    ds = coco["generated"]
    full = ShardLoader(str(ds), batch_size=3, transform=t, keys=True, seed=2, num_workers=2)
    ref = [(k, [tg["boxes"] for tg in tgs]) for _, tgs, k in full]
    s = full.stats
    assert s.gpu_images > 0 and s.gpu_fallback > 0  # JPEGs and the set's PNGs
    assert s.gpu_images + s.gpu_fallback == s.samples
    part = ShardLoader(str(ds), batch_size=3, transform=t, keys=True, seed=2)
    it = iter(part)
    next(it), next(it)
    again = ShardLoader(str(ds), batch_size=3, transform=t, keys=True, seed=2, num_workers=2)
    again.load_state_dict(part.state_dict())
    rest = [(k, [tg["boxes"] for tg in tgs]) for _, tgs, k in again]
    assert len(rest) == len(ref) - 2
    for (k1, b1), (k2, b2) in zip(ref[2:], rest, strict=True):
        assert k1 == k2 and all(torch.equal(a, b) for a, b in zip(b1, b2, strict=True))


def _reject(monkeypatch: pytest.MonkeyPatch, spoil: Callable[[torch.Tensor], object] | None = None) -> None:
    """nvJPEG (here: the CPU batch decoder) refuses the second JPEG of every batch; ``spoil``
    also damages its bytes so the CPU rescue fails too."""
    from shardkit.loader.routes.device.stages import DeviceStages

    real = DeviceStages._decode

    def decode(self: Any, slot: Any, batch: Any) -> Any:
        jpegs = slot.jpegs()
        if len(jpegs) < 2:
            return real(self, slot, batch)
        if spoil is not None:  # the staged copy, which the CPU rescue reads
            spoil(jpegs[1])
        return self.decoder.decode([j for i, j in enumerate(jpegs) if i != 1]), [1]

    monkeypatch.setattr(DeviceStages, "_decode", decode)


def test_nvjpeg_rejects_are_decoded_on_the_cpu_with_their_geometry(coco: dict[str, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    t = transforms.detection_train((64, 96), 128)
    cpu = run(coco["sample"], t)
    gpu_route_on_cpu(monkeypatch)
    _reject(monkeypatch)
    loader = ShardLoader(str(coco["sample"]), batch_size=4, transform=t, keys=True, seed=13,
                         gpu=GpuOptions(compile=False))
    gpu = [(i, tg, k) for i, tg, k in loader]
    assert_agree(cpu, gpu)
    assert loader.stats.gpu_fallback >= 1


@pytest.mark.parametrize("pad", [False, 16])
def test_undecodable_images_take_a_neighbour_with_its_target(coco: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                             pad: bool | int) -> None:
    t = transforms.detection_val(64, 128)
    cpu = run(coco["sample"], t, pad=pad)
    gpu_route_on_cpu(monkeypatch)
    _reject(monkeypatch, spoil=lambda jpeg: jpeg.zero_())
    loader = ShardLoader(str(coco["sample"]), batch_size=4, transform=t, keys=True, seed=13, pad=pad,
                         gpu=GpuOptions(compile=False))
    gpu = [(i, tg, k) for i, tg, k in loader]
    assert loader.stats.replaced >= 1
    replaced = 0
    for (_, ct, ck), (gi, gt, gk) in zip(cpu, gpu, strict=True):
        stood_in = [j for j in range(len(ck)) if gk[j] != ck[j]]
        assert len(stood_in) <= 1  # a batch with fewer than two JPEGs (PNGs decode in workers) has none
        if not stood_in:
            continue
        replaced += 1
        j = stood_in[0]
        src = ck.index(gk[j])
        assert gt[j] is gt[src] and gt[src]["image_id"] == ct[src]["image_id"]
        a, b = image_list(gi)[j], image_list(gi)[src]
        assert torch.equal(a, b)
    assert replaced == loader.stats.replaced
    with pytest.raises(LoaderError, match="neither nvJPEG nor the CPU"):
        next(iter(ShardLoader(str(coco["sample"]), batch_size=4, transform=t, seed=13, on_error="raise",
                              gpu=GpuOptions(compile=False))))


def test_transforms_the_gpu_route_cannotrun(coco: dict[str, Path]) -> None:
    from torchvision.transforms import v2

    from shardkit.transforms.detection_geometry import gpu_unsupported

    reader = ShardLoader(str(coco["sample"]), batch_size=2).reader
    custom = DetectionTransform([v2.RandomPhotometricDistort(), v2.RandomHorizontalFlip()], random=True)
    with pytest.raises(LoaderError, match="RandomPhotometricDistort changes pixels"):
        RawDetectionBuilder(reader, custom)
    assert "not a DetectionTransform" in (gpu_unsupported(lambda image, target: (image, target)) or "")
    twice = DetectionTransform([v2.RandomHorizontalFlip(), v2.RandomShortestSize(64, 128)], random=True)
    assert "more than one crop-resize-flip window" in (gpu_unsupported(twice) or "")
    nearest = DetectionTransform([v2.Resize(64, interpolation=v2.InterpolationMode.NEAREST)], random=False)
    assert "antialiased bilinear" in (gpu_unsupported(nearest) or "")
    sanitize = DetectionTransform([v2.SanitizeBoundingBoxes()], random=False)
    assert "labels_getter" in (gpu_unsupported(sanitize) or "")


def test_cuda_without_cuda_falls_back_to_the_cpu_route_with_one_warning(coco: dict[str, Path],
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    routing._warned.clear()
    t = transforms.detection_train((64, 96), 128)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        loader = ShardLoader(str(coco["sample"]), batch_size=2, transform=t, device="cuda")
        ShardLoader(str(coco["sample"]), batch_size=2, transform=t, device="cuda")
        ShardLoader(str(coco["sample"]), batch_size=2, transform=lambda im, tg: (im, tg), device="cuda")
    assert isinstance(loader.route, CocoRoute) and loader.device.type == "cpu"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("GPU decoding unavailable" in m and "COCO" in m for m in messages) == 1
    # a transform the COCO GPU route cannot run, without CUDA at all: the missing CUDA is the one thing said
    assert sum("CUDA is not available here" in m for m in messages) == 1
    assert not any("cannot run this transform" in m for m in messages)
    images, targets = next(iter(loader))
    assert len(images) == 2 and targets[0]["boxes"].dtype == torch.float32


def test_grayscale_jpegs_ship_encoded_where_the_device_decodes_them(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the device's decoder takes grayscale JPEGs, the workers ship them encoded (fewer
    images decoded in the workers), and the batches still agree with the CPU route's."""
    from PIL import Image

    from sample_data.coco_gen import make_coco
    from shardkit.pack import PackOptions, pack_coco

    images, ann = make_coco(tmp_path / "src", images=10, seed=5)
    for path in sorted(Path(images).glob("*.jpg"))[:3]:
        with Image.open(path) as im:
            gray = im.convert("L")
        gray.save(path, "JPEG", quality=90)
    pack_coco(str(images), str(ann), str(tmp_path / "packed"), options=PackOptions(max_count=4), workers=1)
    t = transforms.detection_train((64, 96), 128)
    cpu = run(tmp_path / "packed", t)
    made = gpu_route_on_cpu(monkeypatch)
    fallbacks = {}
    for gray_on_device in (True, False):
        monkeypatch.setattr("shardkit.loader.routes.coco_gpu.route.gpu_decodes_gray",
                            lambda _device, g=gray_on_device: g)
        loader = ShardLoader(str(tmp_path / "packed"), batch_size=4, transform=t, keys=True, seed=13,
                             gpu=GpuOptions(compile=False))
        gpu = [(i, tg, k) for i, tg, k in loader]
        assert made[-1].builder.gray is gray_on_device
        assert_agree(cpu, gpu)
        fallbacks[gray_on_device] = loader.stats.gpu_fallback
    assert fallbacks[False] - fallbacks[True] == 3, fallbacks


@pytest.mark.parametrize("workers", [0, 2])
def test_a_detection_transform_that_returns_none_is_refused_naming_the_sample(coco: dict[str, Path],
                                                                              workers: int) -> None:
    def forgot_return(image: Any, target: Any) -> None:
        image.float()

    with (ShardLoader(str(coco["sample"]), batch_size=2, transform=forgot_return, num_workers=workers) as loader,
          pytest.raises(LoaderError, match=r"the transform returned None \(a function without a return\?\)") as info):
        next(iter(loader))
    assert ".tar:" in info.value.where


def test_a_loader_copied_after_its_first_epoch_stages_into_slots_of_its_own(
        coco: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Pickled or deep-copied once it has run (its staging slots made, on a CUDA device each with
    the CUDA event its last batch left, which cannot be pickled; _EventStandIn plays it here):
    the copy makes its own slots and gives the original's next epoch. The route's slots, made in
    its constructor, also travelled with every copy (about 170 MB on a GPU)."""
    import copy
    import pickle

    gpu_route_on_cpu(monkeypatch)
    kw: dict[str, Any] = {"batch_size": 4, "transform": TRANSFORMS["train"](), "keys": True, "seed": 13,
                          "gpu": GpuOptions(compile=False)}
    with ShardLoader(str(coco["sample"]), **kw) as fresh:
        assert fresh.route._slots == []  # type: ignore[attr-defined]  # none before the first iteration
    with ShardLoader(str(coco["sample"]), **kw) as loader:
        list(loader)
        route = loader.route
        assert isinstance(route, CocoGpuRoute) and route._slots
        route._slots[0].event = _EventStandIn()  # type: ignore[assignment]
        twins = [pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)]
        loader.set_epoch(1)
        want = [keys for _, _, keys in loader]
    for twin in twins:
        with twin:
            twin.set_epoch(1)
            assert [keys for _, _, keys in twin] == want


class _EventStandIn:
    """What a slot's ``torch.cuda.Event`` is to pickling (refused) and to staging (waited on)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()  # cannot be pickled, as a CUDA event cannot

    def synchronize(self) -> None:
        pass
