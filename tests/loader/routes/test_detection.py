"""COCO loading: targets equal torchvision's wrapped CocoDetection; train transforms keep boxes,
masks and pixels together; deterministic for any worker count; contiguous labels; padding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torchvision.transforms.v2.functional import pil_to_tensor

from sample_data.coco_gen import make_coco
from shardkit import ShardLoader, transforms
from shardkit.errors import LoaderError
from shardkit.loader.routes.coco.target import BadTarget, coco_target
from shardkit.pack import PackOptions, pack_coco

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "coco"
KEYS = ("image_id", "boxes", "labels", "masks", "area", "iscrowd")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Path]]:
    """``name -> (images_dir, instances.json, packed dataset)`` for the shipped and a generated set."""
    root = tmp_path_factory.mktemp("coco")
    generated = make_coco(root / "gen", images=14, seed=3)
    out = {}
    inputs = {"sample": (SAMPLE / "images", SAMPLE / "instances.json"), "generated": generated}
    for name, (images, ann) in inputs.items():
        dst = root / f"{name}-packed"
        pack_coco(str(images), str(ann), str(dst), options=PackOptions(max_count=6), workers=1)
        out[name] = (Path(images), Path(ann), dst)
    return out


def _by_image_id(loader: ShardLoader) -> dict[Any, tuple[Any, dict[str, Any]]]:
    out: dict[Any, tuple[Any, dict[str, Any]]] = {}
    for images, targets, _keys in loader:
        for image, target in zip(images, targets, strict=True):
            out.setdefault(target["image_id"], (image, target))
    return out


@pytest.mark.parametrize("name", ["sample", "generated"])
def test_val_targets_equal_torchvision(sources: dict[str, tuple[Path, Path, Path]], name: str) -> None:
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    images_dir, ann, packed = sources[name]
    reference = wrap_dataset_for_transforms_v2(CocoDetection(str(images_dir), str(ann)), target_keys=KEYS)
    loader = ShardLoader(str(packed), batch_size=5, transform=transforms.detection_val(), shuffle=False,
                         keys=True, masks=True)
    ours = _by_image_id(loader)
    assert len(ours) == len(reference)
    for index in range(len(reference)):
        ref_image, ref = reference[index]
        image, target = ours[ref["image_id"]]
        assert torch.equal(image, pil_to_tensor(ref_image))
        assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
        if set(ref) == {"image_id"}:  # torchvision gives only the id for an image without annotations
            assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
            assert target["masks"].shape == (0, *image.shape[-2:])
            continue
        assert torch.equal(target["boxes"], ref["boxes"].as_subclass(torch.Tensor).float())
        assert torch.equal(target["labels"], ref["labels"])
        assert torch.equal(target["masks"], ref["masks"].as_subclass(torch.Tensor))
        assert torch.equal(target["area"], torch.tensor(ref["area"], dtype=torch.float32))
        assert target["iscrowd"].tolist() == ref["iscrowd"]
    assert any(1 in t["iscrowd"].tolist() for _, t in ours.values())  # crowd RLE was covered


def test_contiguous_labels(sources: dict[str, tuple[Path, Path, Path]]) -> None:
    _, ann, packed = sources["generated"]
    categories = json.loads(ann.read_text(encoding="utf-8"))["categories"]
    plain = ShardLoader(str(packed), batch_size=4, shuffle=False, keys=True)
    mapped = ShardLoader(str(packed), batch_size=4, shuffle=False, keys=True, contiguous_labels=True)
    assert plain.label_map is None and list(mapped.categories or ()) == categories
    assert mapped.label_map == {1: 1, 3: 2, 18: 3, 90: 4}
    for (_, t1, _), (_, t2, _) in zip(plain, mapped, strict=True):
        for a, b in zip(t1, t2, strict=True):
            assert b["labels"].tolist() == [mapped.label_map[c] for c in a["labels"].tolist()]


def _mask_inside_boxes(target: dict[str, Any], height: int, width: int, tolerance: int) -> None:
    boxes = target["boxes"]
    n = boxes.shape[0]
    assert all(target[k].shape[0] == n for k in ("labels", "area", "iscrowd", "masks"))
    assert target["masks"].shape[1:] == (height, width)
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
    assert (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()
    assert (boxes[:, 2] - boxes[:, 0] >= 1).all() and (boxes[:, 3] - boxes[:, 1] >= 1).all()
    for box, mask in zip(boxes.tolist(), target["masks"], strict=True):
        x0, y0, x1, y1 = (int(v) for v in box)
        outside = mask.clone()
        outside[max(0, y0 - tolerance):y1 + tolerance + 1, max(0, x0 - tolerance):x1 + tolerance + 1] = 0
        assert int(outside.sum()) == 0


@pytest.mark.parametrize("name", ["sample", "generated"])
def test_train_transforms_keep_boxes_masks_and_pixels_together(sources: dict[str, tuple[Path, Path, Path]],
                                                                name: str) -> None:
    _, ann, packed = sources[name]
    first_area: dict[int, float] = {}  # generated: the first annotation's region is painted white
    for a in json.loads(ann.read_text(encoding="utf-8"))["annotations"]:
        first_area.setdefault(a["image_id"], a["area"])
    t = transforms.detection_train(min_size=(64, 96), max_size=128, flip_p=0.5, iou_crop=True)
    loader = ShardLoader(str(packed), batch_size=4, transform=t, masks=True, seed=5)
    checked = 0
    for _ in range(2 if name == "generated" else 1):  # two epochs: other crops and flips
        for images, targets in loader:
            for image, target in zip(images, targets, strict=True):
                assert image.dtype == torch.uint8 and max(image.shape[-2:]) <= 128
                _mask_inside_boxes(target, image.shape[-2], image.shape[-1], tolerance=4)
                if name != "generated":
                    continue
                area = torch.tensor(first_area.get(target["image_id"], -1.0), dtype=torch.float32)
                hits = (target["area"] == area).nonzero()
                if len(hits) and target["iscrowd"][hits[0, 0]] == 0:
                    j = int(hits[0, 0])
                    bright = image.min(0).values > 230  # the painted rectangle (background < 200)
                    ys, xs = bright.nonzero(as_tuple=True)
                    x0, y0, x1, y1 = target["boxes"][j].tolist()
                    assert x0 <= float(xs.float().mean()) <= x1 and y0 <= float(ys.float().mean()) <= y1
                    assert float(bright[target["masks"][j].bool()].float().mean()) > 0.5
                    checked += 1
    assert name != "generated" or checked > 5


def test_deterministic_for_any_worker_count_and_global_rng_untouched(
        sources: dict[str, tuple[Path, Path, Path]]) -> None:
    packed = sources["sample"][2]
    t = transforms.detection_train(min_size=(48, 64), max_size=96, scale_jitter=None)

    def run(workers: int) -> list[Any]:
        loader = ShardLoader(str(packed), batch_size=4, transform=t, seed=11, num_workers=workers, masks=True,
                             keys=True)
        return [(keys, images, targets) for images, targets, keys in loader]

    state = torch.get_rng_state()
    first = run(0)
    assert torch.equal(torch.get_rng_state(), state)
    for other in (run(0), run(2)):
        assert len(other) == len(first)
        for (k1, i1, t1), (k2, i2, t2) in zip(first, other, strict=True):
            assert k1 == k2 and all(torch.equal(a, b) for a, b in zip(i1, i2, strict=True))
            for a, b in zip(t1, t2, strict=True):
                assert a.keys() == b.keys() and a["image_id"] == b["image_id"]
                assert all(torch.equal(a[k], b[k]) for k in a if k != "image_id")


def test_resume_mid_epoch(sources: dict[str, tuple[Path, Path, Path]]) -> None:
    packed = sources["generated"][2]
    t = transforms.detection_train(min_size=48, max_size=64)
    full = [(k, [x["boxes"] for x in tg])
            for _, tg, k in ShardLoader(str(packed), batch_size=3, transform=t, keys=True)]
    first = ShardLoader(str(packed), batch_size=3, transform=t, keys=True)
    it = iter(first)
    next(it), next(it)
    resumed = ShardLoader(str(packed), batch_size=3, transform=t, keys=True)
    resumed.load_state_dict(first.state_dict())
    rest = [(k, [x["boxes"] for x in tg]) for _, tg, k in resumed]
    assert len(rest) == len(full) - 2
    for (k1, b1), (k2, b2) in zip(full[2:], rest, strict=True):
        assert k1 == k2 and all(torch.equal(a, b) for a, b in zip(b1, b2, strict=True))


def test_padded_batches(sources: dict[str, tuple[Path, Path, Path]]) -> None:
    packed = sources["generated"][2]
    lists = list(ShardLoader(str(packed), batch_size=4, shuffle=False))
    padded = list(ShardLoader(str(packed), batch_size=4, shuffle=False, pad=32))
    for (images, _), ((batch, sizes), _) in zip(lists, padded, strict=True):
        assert batch.shape[-1] % 32 == 0 and batch.shape[-2] % 32 == 0
        for i, image in enumerate(images):
            h, w = image.shape[-2:]
            assert sizes[i].tolist() == [h, w]
            assert torch.equal(batch[i, :, :h, :w], image)
            assert int(batch[i, :, h:].sum()) == 0 and int(batch[i, :, :, w:].sum()) == 0


def test_options_refused_where_they_do_not_apply(sources: dict[str, tuple[Path, Path, Path]], packed: Path) -> None:
    with pytest.raises(LoaderError, match="detection transform"):
        ShardLoader(str(sources["sample"][2]), batch_size=2, transform=transforms.imagenet_train(32))
    with pytest.raises(LoaderError, match=r"^masks=True needs a COCO dataset \(packed with shardkit pack "
                                          r"--annotations\); this one is 'imagefolder'$"):
        ShardLoader(str(packed), batch_size=2, masks=True)
    with pytest.raises(LoaderError, match=r"^pad=32 and contiguous_labels=True need a COCO dataset"):
        ShardLoader(str(packed), batch_size=2, pad=32, contiguous_labels=True)
    for detection in (transforms.detection_train(), transforms.detection_val(800, 1333)):
        with pytest.raises(LoaderError, match="detection_train/detection_val need a COCO dataset; this one is "
                                              "'imagefolder': use transforms.imagenet_train"):
            ShardLoader(str(packed), batch_size=2, transform=detection)


def test_classes_name_the_labels(sources: dict[str, tuple[Path, Path, Path]], packed: Path,
                                 indexed_tree: Path) -> None:
    from torchvision.datasets import ImageFolder

    names = ShardLoader(str(packed), batch_size=2).classes
    assert names is not None and list(names) == ImageFolder(str(indexed_tree)).classes
    _, ann, coco = sources["generated"]
    categories = {c["id"]: c["name"] for c in json.loads(ann.read_text(encoding="utf-8"))["categories"]}
    assert ShardLoader(str(coco), batch_size=2).classes is None  # labels are category ids
    mapped = ShardLoader(str(coco), batch_size=2, contiguous_labels=True)
    assert mapped.classes == ("__background__", *(categories[i] for i in sorted(categories)))
    assert mapped.label_map is not None
    assert all(mapped.classes[label] == categories[cid] for cid, label in mapped.label_map.items())


def test_detection_val_is_sized_like_detection_train() -> None:
    import torchvision.transforms.v2 as v2

    image = torch.zeros(3, 400, 600, dtype=torch.uint8)
    target = {"boxes": torch.tensor([[10.0, 20.0, 110.0, 220.0]]), "labels": torch.tensor([1])}
    from shardkit.transforms.detection import run_detection_transform

    out, tgt = run_detection_transform(transforms.detection_val(800, 1333), image, target, seed=0)
    want = v2.Resize(800, max_size=1333)(image)
    assert out.shape == want.shape == (3, 800, 1200)
    assert tgt["boxes"].tolist() == [[20.0, 40.0, 220.0, 440.0]]
    assert transforms.detection_val().random is False
    with pytest.raises(ValueError, match="max_size needs min_size"):
        transforms.detection_val(max_size=1333)
    with pytest.raises(ValueError, match="min_size <= max_size"):
        transforms.detection_val(800, 600)
    square, _ = run_detection_transform(transforms.detection_val(128, 128), image, target, seed=0)
    assert square.shape == (3, 85, 128)  # equal sizes: the longer side to 128, as torchvision's detectors resize


def test_coco_target_edge_cases() -> None:
    meta: dict[str, Any] = {"image": {"id": "a"}, "annotations": []}
    empty = coco_target(meta, 4, 6, masks=True)
    assert empty["image_id"] == "a" and empty["boxes"].shape == (0, 4) and empty["masks"].shape == (0, 4, 6)
    meta["annotations"] = [{"id": 1, "category_id": 7, "bbox": [1, 1, 2, 2]}]
    t = coco_target(json.dumps(meta).encode(), 4, 6)
    assert t["boxes"].tolist() == [[1, 1, 3, 3]] and t["area"].tolist() == [4.0] and t["iscrowd"].tolist() == [0]
    with pytest.raises(BadTarget, match="segmentation"):
        coco_target(meta, 4, 6, masks=True)
    with pytest.raises(BadTarget):
        coco_target(meta, 4, 6, label_map={1: 1})
    with pytest.raises(BadTarget):
        coco_target({"image": {"id": 1}, "annotations": [{"category_id": 1, "bbox": [1, 2]}]}, 4, 6)


@pytest.mark.parametrize("segmentation", [[], [[]], [[1, 2]], [[0, 0, 4, 0]], "garbage",
                                          {"size": [2, 2], "counts": [0, 4]}])
def test_a_segmentation_masks_cannot_be_made_of_is_a_bad_target(segmentation: Any) -> None:
    pytest.importorskip("pycocotools")
    meta = {"image": {"id": 1}, "annotations": [{"id": 1, "bbox": [0, 0, 2, 2], "category_id": 1,
                                                   "segmentation": segmentation}]}
    with pytest.raises(BadTarget, match="segmentation|RLE"):  # [] raised pycocotools' IndexError, unnamed
        coco_target(meta, 8, 8, masks=True)


def test_a_mask_decodes_where_warnings_are_errors() -> None:
    """pycocotools' decode warns (a DeprecationWarning under numpy 2) at every call: under
    ``-W error`` (pytest's ``filterwarnings = error``) every mask was a bad sample, replaced."""
    import warnings

    pytest.importorskip("pycocotools")
    meta = {"image": {"id": 1}, "annotations": [{"id": 1, "bbox": [0, 0, 4, 4], "category_id": 1,
                                                   "segmentation": [[0, 0, 4, 0, 4, 4, 0, 4]]}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target = coco_target(meta, 8, 8, masks=True)
    assert target["masks"].shape == (1, 8, 8) and int(target["masks"].sum()) > 0


def test_a_mask_decodes_off_the_main_thread_where_warnings_are_errors() -> None:
    """The COCO GPU route without workers decodes in its prefetch thread, where the main thread's
    catch_warnings cannot serve: ``python -W error`` made each of its masks a bad sample."""
    import subprocess
    import sys

    pytest.importorskip("pycocotools")
    code = ("import threading\n"
            "from shardkit.loader.routes.coco.target import segmentation_to_mask\n"
            "out = []\n"
            "t = threading.Thread(target=lambda: out.append(int(segmentation_to_mask([[0, 0, 4, 0, 4, 4, 0, 4]], 8, "
            "8).sum())))\n"
            "t.start(); t.join(); print(out)\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[16]", done.stderr[-2000:]
