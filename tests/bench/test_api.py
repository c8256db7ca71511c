"""What ``run_bench`` measures on a COCO source: which loaders, on which device (no timing)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shardkit.bench import api
from shardkit.bench.api import BenchConfig
from shardkit.pack.options import PackOptions

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "imagefolder"


def test_coco_rows_cpu_route_on_the_cpu_and_the_gpu_route_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    built: dict[str, dict[str, Any]] = {}
    monkeypatch.setattr(api.runner, "detection_shardloader", lambda shards, **kw: built.setdefault(kw["device"], kw))
    monkeypatch.setattr(api.baselines, "cocodetection_loader", lambda *a, **kw: built.setdefault("baseline", kw))
    for device, names in (("cpu", ["cocodetection", "shardloader"]),
                          ("cuda", ["cocodetection", "shardloader", "shardloader-gpu"])):
        built.clear()
        cfg = BenchConfig("images", annotations="instances.json", device=device, size=800, max_size=1333)
        rows = api._coco_contenders(cfg, "shards")
        assert [r.name for r in rows] == names
        for r in rows:
            r.build()
        assert built["baseline"]["device"] == device and "cpu" in built  # the CPU route delivers on the CPU
        assert ("cuda" in built) is (device == "cuda")
        assert all(kw["min_size"] == 800 and kw["max_size"] == 1333 for kw in built.values())


def test_coco_bench_needs_pycocotools_for_its_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pycocotools" else real(name, *a))
    with pytest.raises(ValueError, match="pycocotools"):
        BenchConfig("images", annotations="instances.json").validate()


def test_coco_shards_must_have_the_sources_images_and_categories() -> None:
    """The same number of images is not enough: other category ids would give the loaders other labels."""
    from shardkit.index.manifest import Manifest, ShardEntry

    shards = (ShardEntry("s-000000.tar", 3, 100, "0" * 64),)
    packed = Manifest("coco", shards, categories=({"id": 1}, {"id": 17}))
    data = {"kind": "coco", "path": "images", "images": 3, "category_ids": [1, 17]}
    api.check_same_data(packed, data, "shards", None)
    with pytest.raises(ValueError, match="2 categories, but images has COCO annotations for 3 images and 3 "
                                         "categories.*omit --shards"):
        api.check_same_data(packed, {**data, "category_ids": [1, 17, 18]}, "shards", None)
    with pytest.raises(ValueError, match=r"--annotations --drop-empty\)$"):
        api.check_same_data(packed, {**data, "images": 4}, "shards", None, can_omit=False)


def test_class_names_are_compared_unless_adopted_shards_know_only_their_labels() -> None:
    """Shards another tool wrote, adopted with ``shardkit index`` and no ``--classes``, name their
    classes "0", "1": they were refused as "named otherwise" though their labels are the folder's."""
    from shardkit.index.manifest import Manifest, ShardEntry

    shards = (ShardEntry("s-000000.tar", 4, 100, "0" * 64),)
    data = {"path": "tree", "images": 4, "classes": 2, "class_names": ["cat", "dog"]}
    api.check_same_data(Manifest("imagefolder", shards, classes=("cat", "dog")), data, "shards", None)
    with pytest.raises(ValueError, match=r"names its classes otherwise than tree \(class 1: 'cow' packed, 'dog'"):
        api.check_same_data(Manifest("imagefolder", shards, classes=("cat", "cow")), data, "shards", None)
    api.check_same_data(Manifest("imagefolder", shards, classes=("0", "1"), adopted=True), data, "shards", None)
    with pytest.raises(ValueError, match="names its classes otherwise"):  # packed so: a name like any other
        api.check_same_data(Manifest("imagefolder", shards, classes=("0", "1")), data, "shards", None)


def test_webdataset_plan_rebatches_where_a_worker_reads_less_than_a_batch() -> None:
    """webdataset's workers split whole shards and batch what they read: 300 images in 10 shards for
    8 workers are 30 to 60 images each, no batch of 256 for any, and the bench timed 0 batches. The
    plan rebatches there (as many batches as the other loaders); where every worker has a batch it
    batches in the workers, and the checks count the batches each worker makes."""
    plan = api.webdataset_plan([30] * 10, workers=8, batch_size=256)
    assert (plan.workers, plan.rebatch, plan.batches_per_epoch) == (8, True, 1)
    assert sorted(set(plan.shares)) == [30, 60]
    own = api.webdataset_plan([5, 5, 5, 5, 4], workers=2, batch_size=8)
    assert (own.shares, own.rebatch, own.batches_per_epoch) == ((14, 10), False, 2)  # 24 // 8 would be 3
    assert api.webdataset_plan([13, 11], workers=3, batch_size=4).workers == 2
    assert api.webdataset_plan([24], workers=0, batch_size=8).batches_per_epoch == 3
    assert api.epochs_for(24, batch_size=8, warmup=5, workers=1, per_epoch=2) == 6
    with pytest.raises(ValueError, match=r"^webdataset's 2 workers, each batching its own shards \(14 and 10 images\), "
                                         r"make 4 batches of 8 in 2 epochs of 24 images, which leave 4 batches to "
                                         r"time after --warmup 0, no more than the 4 that 2 workers prepare ahead"):
        api.check_timed_batches(24, batch_size=8, epochs=2, warmup=0, workers=2, per_epoch=2,
                                whose="webdataset's 2 workers, each batching its own shards (14 and 10 images), make")


def test_a_refused_plan_names_the_fewest_epochs_and_the_most_warmup_that_pass() -> None:
    """The error said "raise --epochs, or lower --warmup or --batch-size" without a value: --epochs 1
    on 300 images at batch 64 was refused, then --warmup 0 was refused again. Its values now pass
    the check of every loader named (this one and ``others``), and one less (more) would not."""
    import itertools
    import re

    with pytest.raises(ValueError, match=r"leave none to time after --warmup 5; raise --epochs to 3$"):
        api.check_timed_batches(300, batch_size=64, epochs=1, warmup=5, workers=2)

    def passes(per_epoch: int, workers: int, epochs: int, warmup: int) -> bool:
        try:
            api.check_timed_batches(per_epoch * 8, batch_size=8, epochs=epochs, warmup=warmup, workers=workers)
        except ValueError:
            return False
        return True

    for per_epoch, other, workers, epochs, warmup in itertools.product((1, 3, 4, 9), (1, 2, 4), (0, 1, 3),
                                                                       (1, 2, 3), (0, 2, 5, 11)):
        loaders = [(per_epoch, workers), (other, max(workers - 1, 0))]
        try:
            api.check_timed_batches(per_epoch * 8, batch_size=8, epochs=epochs, warmup=warmup, workers=workers,
                                    others=loaders[1:])
        except ValueError as err:
            said = re.search(r"; raise --epochs to (\d+)(?:, or lower --warmup to (\d+))?$", str(err))
            assert said is not None, err
            fewest = int(said[1])
            assert all(passes(p, w, fewest, warmup) for p, w in loaders), err
            assert not all(passes(p, w, fewest - 1, warmup) for p, w in loaders), err
            assert (said[2] is None) == (not all(passes(p, w, epochs, 0) for p, w in loaders)), err
            if said[2] is not None:
                most = int(said[2])
                assert all(passes(p, w, epochs, most) for p, w in loaders), err
                assert not all(passes(p, w, epochs, most + 1) for p, w in loaders), err


def test_shards_of_another_kind_are_described_by_what_they_hold() -> None:
    """COCO shards given to an ImageFolder bench were said to hold "coco data of 0 classes" (COCO
    has categories, not classes): each kind is described by its own counts."""
    from shardkit.index.manifest import Manifest, ShardEntry

    shards = (ShardEntry("s-000000.tar", 3, 100, "0" * 64),)
    folder = {"path": "tree", "images": 4, "classes": 2}
    coco = Manifest("coco", shards, categories=tuple({"id": i} for i in range(1, 16)))
    with pytest.raises(ValueError, match=r"^--shards shards holds coco data of 3 source images and 15 categories, "
                                         r"but tree has 2 classes and 4 images"):
        api.check_same_data(coco, folder, "shards", None)
    with pytest.raises(ValueError, match=r"^--shards shards holds captions data of 3 source images, but tree has"):
        api.check_same_data(Manifest("captions", shards), folder, "shards", None)
    with pytest.raises(ValueError, match=r"^--shards shards holds imagefolder data of 1 class and 3 source images, "
                                         r"but images has COCO annotations"):
        api.check_same_data(Manifest("imagefolder", shards, classes=("cat",)),
                            {"kind": "coco", "path": "images", "images": 3, "category_ids": [1]}, "shards", None)


def test_more_workers_than_cores_is_one_note_and_a_malformed_launcher_variable_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.bench.checks import too_many_workers

    monkeypatch.setattr("shardkit.machine.cores_of_this_process", lambda: 2)
    monkeypatch.setattr("shardkit.machine.auto_workers", lambda: 1)
    assert too_many_workers(2) is None
    assert too_many_workers(3) == ("3 workers a loader, more than the 2 cores that are this process's share: the "
                                   "workers take turns on them (--workers auto picks 1)")
    monkeypatch.undo()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")  # the bench runs on; the loaders name the variable where it matters
    assert too_many_workers(1_000_000) is None


def test_the_timing_bars_label_counts_each_loaders_runs_as_the_printed_lines_do() -> None:
    """With --repeats 2 the bar read "webdataset 2/6" (runs of every loader together) where the
    lines printed without a bar say "webdataset run 1/2"."""
    import torch

    from shardkit.bench import Contender

    class Sink:
        def __init__(self) -> None:
            self.labels: list[str] = []

        def begin(self, what: str, total: int | None) -> None: ...
        def advance(self, n: int) -> None: ...

        def describe(self, text: str) -> None:
            self.labels.append(text)

    epoch = [(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))] * 3
    contenders = [Contender(name, name, lambda: epoch, baseline=name == "imagefolder")
                  for name in ("imagefolder", "webdataset", "shardloader")]
    sink = Sink()
    api._run(BenchConfig("tree", epochs=1, repeats=2), contenders, 0, {c.name: 3 for c in contenders}, None, sink,
             None)
    assert sink.labels == ["imagefolder run 1/2", "webdataset run 1/2", "shardloader run 1/2",
                           "shardloader run 2/2", "webdataset run 2/2", "imagefolder run 2/2"]


def test_the_check_before_packing_plans_webdataset_over_the_shards_already_packed(tmp_path: Path) -> None:
    """With --shards holding a pack, the values the first check names come from that pack's shards,
    not from those the bench would pack: 300 images packed 100 a shard, batch 64, 4 workers, warm-up
    20 named --epochs 8, which the check after it refused again (webdataset's workers make fewer
    batches of those shards)."""
    from shardkit.bench.webdataset_plan import webdataset_plan
    from shardkit.pack import pack

    shards = tmp_path / "s"
    pack(str(SAMPLE), str(shards), options=PackOptions(max_count=100))
    cfg = api.BenchConfig(str(SAMPLE), shards=str(shards), workers=4, batch_size=64, warmup=20, epochs=1)
    plan = webdataset_plan([100, 100, 100], workers=4, batch_size=64)
    assert api._planned_webdataset(cfg, 300) == [(plan.batches_per_epoch, plan.workers)]
    assert api._planned_webdataset(replace(cfg, shards=str(tmp_path / "none")), 300) != \
        [(plan.batches_per_epoch, plan.workers)]
