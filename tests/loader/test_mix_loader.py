"""ShardLoader over a weighted mix of packed datasets: each epoch's composition, labels as packed
(or offset), pixels from the right dataset, exact and elastic resume, and the checks that refuse
datasets, weights or states that do not fit."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sample_data.coco_gen import make_coco
from sample_data.generate import decode_index, make_indexed_imagefolder
from shardkit import LoaderError, ShardLoader
from shardkit.index.manifest_io import locate_dataset, read_manifest
from shardkit.loader.read.datasets import _first_difference
from shardkit.loader.read.reader import ReaderPart, ShardReader
from shardkit.pack import PackOptions, pack, pack_coco

A_PER_CLASS, B_PER_CLASS, C_PER_CLASS = 23, 10, 5  # packed (conftest): 3 classes of 23, 64x48


def _pack(tmp: pytest.TempPathFactory, name: str, classes: int, per_class: int, max_count: int) -> str:
    root = tmp.mktemp(name)
    make_indexed_imagefolder(root / "src", classes=classes, per_class=per_class, size=(32, 40))
    pack(str(root / "src"), str(root / "ds"), options=PackOptions(max_count=max_count, seed=2), workers=1)
    return str(root / "ds")


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> str:
    """20 samples, classes c000-c001 (another class list than ``packed``), 32x40, shards of <= 6."""
    return _pack(tmp_path_factory, "mix-b", 2, B_PER_CLASS, 6)


@pytest.fixture(scope="module")
def same_classes(tmp_path_factory: pytest.TempPathFactory) -> str:
    """15 samples, classes c000-c002 (``packed``'s list), 32x40, shards of <= 4."""
    return _pack(tmp_path_factory, "mix-c", 3, C_PER_CLASS, 4)


def _samples(loader: ShardLoader, epoch: int, *, per_class: int = B_PER_CLASS,
             offset: int = 3) -> list[tuple[str, int, str]]:
    """Epoch ``epoch``'s samples as (dataset, label, key), checking each one's pixels against its
    key and its label against its class: dataset "a" is ``packed`` (64x48, 23 per class), "b" the
    other one (32x40, ``per_class`` per class, labels offset by ``offset``)."""
    loader.set_epoch(epoch)
    out = []
    for images, labels, keys in loader:
        for image, label, key in zip(images, labels.tolist(), keys, strict=True):
            index = int(key)
            assert decode_index(image) == index
            dataset = "a" if tuple(image.shape) == (3, 48, 64) else "b"
            expected = index // A_PER_CLASS if dataset == "a" else offset + index // per_class
            assert label == expected
            out.append((dataset, label, key))
    return out


def _loader(datasets: list[str], **kwargs: Any) -> ShardLoader:
    return ShardLoader(datasets, **{"batch_size": 4, "keys": True, "seed": 7, **kwargs})


def test_each_epoch_holds_each_datasets_quota(packed: Path, other: str) -> None:
    with _loader([str(packed), other], weights=[0.5, 0.5], disjoint_labels=True, drop_last=False,
                 even_batches=False) as loader:  # every position once: the epoch as planned
        assert loader.mix is not None and loader.mix.quotas == [45, 44]  # 89 samples: 44.5 each
        assert loader.classes == ("c000", "c001", "c002", "c000", "c001")
        assert loader.class_to_idx == {"c000": 0, "c001": 1, "c002": 2}  # a name twice: its first label
        seen: dict[str, set[str]] = {"a": set(), "b": set()}
        for epoch in (0, 1, 2):
            samples = _samples(loader, epoch)
            counts = Counter(dataset for dataset, _, _ in samples)
            assert counts == {"a": 45, "b": 44}
            a_keys = Counter(key for dataset, _, key in samples if dataset == "a")
            assert max(a_keys.values()) == 1  # under-weighted: never twice in an epoch
            b_keys = Counter(key for dataset, _, key in samples if dataset == "b")
            assert set(b_keys.values()) <= {2, 3} and len(b_keys) == 20  # 2.2 passes
            for dataset, _, key in samples:
                seen[dataset].add(key)
            if epoch == 1:  # a's round: ceil(69 / 45) = 2 epochs
                assert len(seen["a"]) == 69


def test_labels_are_as_packed_when_the_class_lists_match(packed: Path, same_classes: str) -> None:
    with _loader([str(packed), same_classes], weights=[1, 1], even_batches=False) as loader:
        assert loader.classes == ("c000", "c001", "c002")
        assert loader.manifest.classes == loader.classes and len(loader.manifests) == 2
        counts = Counter(dataset for dataset, _, _ in _samples(loader, 0, per_class=C_PER_CLASS, offset=0))
        assert counts == {"a": 42, "b": 42}


def test_without_weights_a_mix_is_the_concatenation(packed: Path, same_classes: str) -> None:
    with _loader([str(packed), same_classes], even_batches=False, shuffle=False) as loader:
        samples = _samples(loader, 0, per_class=C_PER_CLASS, offset=0)
        assert [d for d, _, _ in samples] == ["a"] * 69 + ["b"] * 15
        alone = []
        for dataset in (str(packed), same_classes):
            with _loader([dataset], even_batches=False, shuffle=False) as single:
                alone += [key for _, _, keys in single for key in keys]
        assert [key for _, _, key in samples] == alone


def _run(loader: ShardLoader, epoch: int, stop: int | None = None) -> list[tuple[str, int, str]]:
    """The samples of the next ``stop`` batches (all when None) of ``epoch``."""
    loader.set_epoch(epoch)
    out: list[tuple[str, int, str]] = []
    it = iter(loader)
    for batch in it if stop is None else (next(it) for _ in range(stop)):
        out += _samples_of(loader, batch)
    return out


def _samples_of(loader: ShardLoader, batch: Any) -> list[tuple[str, int, str]]:
    images, labels, keys = batch
    return [("a" if tuple(image.shape) == (3, 48, 64) else "b", label, key)
            for image, label, key in zip(images, labels.tolist(), keys, strict=True)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_resumes_exactly_mid_epoch(packed: Path, other: str, workers: int) -> None:
    options: dict[str, Any] = {"weights": [0.3, 0.7], "disjoint_labels": True, "drop_last": True}
    with _loader([str(packed), other], **options) as loader:
        whole = _run(loader, 1)
        following = _run(loader, 2)
    with _loader([str(packed), other], **options) as loader:
        head = _run(loader, 1, stop=5)
        state = loader.state_dict()
    assert state["mix"][1]["quota"] == 62 and state["batches_consumed"] == 5
    with _loader([str(packed), other], num_workers=workers, **options) as resumed:
        resumed.load_state_dict(state)
        assert len(resumed) == 22
        tail = _run(resumed, resumed.epoch)
        assert head + tail == whole
        assert _run(resumed, 2) == following


def test_a_mix_resumes_elastically_with_the_rest_of_the_epoch(packed: Path, other: str) -> None:
    """2 ranks x 3 stop after 4 steps; 1 rank x 5 delivers the rest: with drop_last, nothing twice
    beyond what the epoch holds, and nothing lost but each layout's dropped tail."""
    options: dict[str, Any] = {"weights": [0.6, 0.4], "disjoint_labels": True, "drop_last": True}
    with _loader([str(packed), other], batch_size=89, world_size=1, rank=0, **options) as one:
        epoch = Counter(_run(one, 3))  # all 89 samples of epoch 3 (duplicates of b included)
    ranks = [_loader([str(packed), other], batch_size=3, world_size=2, rank=r, **options) for r in (0, 1)]
    before: list[tuple[str, int, str]] = []
    for loader in ranks:
        before += _run(loader, 3, stop=4)
    state = ranks[0].state_dict()
    for loader in ranks:
        loader.close()
    with _loader([str(packed), other], batch_size=5, world_size=1, rank=0, **options) as resumed:
        resumed.load_state_dict(state)
        after = _run(resumed, resumed.epoch)
    delivered = Counter(before + after)
    assert not delivered - epoch  # nothing more often than the epoch holds it
    lost = sum((epoch - delivered).values())
    assert lost <= (2 * 3 - 1) + (5 - 1)


def test_a_state_for_another_mix_is_refused_naming_it(packed: Path, other: str) -> None:
    with _loader([str(packed), other], weights=[1, 1], disjoint_labels=True) as loader:
        state = loader.state_dict()
    with _loader([str(packed), other], weights=[2, 1], disjoint_labels=True) as loader, \
            pytest.raises(LoaderError, match=r"mix: the weights differ: dataset 0 takes 45 samples an epoch in "
                                             r"the state, 59 in this loader \(resume with the datasets, in their"):
        loader.load_state_dict(state)
    with _loader([str(packed)]) as single, pytest.raises(LoaderError, match="mix: state has a mix of 2"):
        single.load_state_dict(state)


def test_what_is_not_a_loader_state_is_said_so(packed: Path) -> None:
    """A whole checkpoint, or another library's state, read as 'unsupported state version None'."""
    with _loader([str(packed)]) as loader:
        state = loader.state_dict()
        with pytest.raises(LoaderError, match=r"a mapping holding one under 'loader' \(keys: loader, model\): "
                                              r"load_state_dict\(checkpoint\['loader'\]\)"):
            loader.load_state_dict({"model": {}, "loader": state})
        with pytest.raises(LoaderError, match=r"holding one under 'loader'"):  # a checkpoint's own version
            loader.load_state_dict({"version": 1, "model": {}, "loader": state})
        with pytest.raises(LoaderError, match=r"not a ShardLoader state \(keys: _snapshot, steps\)"):
            loader.load_state_dict({"_snapshot": {}, "steps": 3})


def test_datasets_whose_labels_clash_are_refused(packed: Path, other: str, same_classes: str) -> None:
    a, b = re.escape(str(packed)), re.escape(other)
    with pytest.raises(LoaderError, match=rf"class lists differ: {a} has 3 classes, {b} has 2 \({a} adds 'c002'\)"
                                          r"; labels would mean different classes \(they share 2 class names "
                                          r"\('c000'…\), which disjoint_labels=True would make classes of their "
                                          r"own: .*shardkit pack --allow-empty"):
        ShardLoader([str(packed), other], batch_size=2)
    ShardLoader([str(packed), same_classes, str(packed)], batch_size=2).close()  # a dataset may come twice


def test_datasets_of_no_shared_class_are_pointed_at_disjoint_labels(packed: Path, tmp_path: Path) -> None:
    """Class lists with no name in common: the advice is disjoint_labels=True (an IndexError came
    out instead, from naming the first shared class of none)."""
    root = tmp_path / "src"
    make_indexed_imagefolder(root, classes=2, per_class=3, size=(32, 40))
    for old in root.iterdir():
        old.rename(root / f"d{old.name}")
    pack(str(root), str(tmp_path / "ds"), workers=1)
    with pytest.raises(LoaderError, match=r"class lists differ: .*; labels would mean different classes \(pass "
                                          r"disjoint_labels=True to give each dataset its own labels"):
        ShardLoader([str(packed), str(tmp_path / "ds")], batch_size=2)


def test_a_dataset_listed_twice_in_a_mix_is_said(packed: Path, other: str, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """[D, D] reads each of D's samples twice an epoch: likely a slip, so said (a relative path too)."""
    with caplog.at_level("WARNING", logger="shardkit"):
        ShardLoader([str(packed), other], batch_size=2, disjoint_labels=True).close()
    assert not [r for r in caplog.records if "same dataset" in r.getMessage()]
    monkeypatch.chdir(packed.parent)
    with caplog.at_level("WARNING", logger="shardkit"):
        loader = ShardLoader([str(packed), f"{packed.name}/index.json"], batch_size=2)
    said = [r.getMessage() for r in caplog.records if "same dataset" in r.getMessage()]
    assert said == [f"shardkit: {packed} and {packed.name}/index.json are the same dataset: the mix reads each of "
                    "its samples once for each time it is listed (weights set a dataset's share)"]
    assert loader.manifest.num_samples == 2 * loader.manifests[0].num_samples
    loader.close()


def test_mix_options_that_change_nothing_on_one_dataset_are_said(packed: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """weights=[0.5] on one dataset read as half an epoch and silently gave all of it."""
    with caplog.at_level("WARNING", logger="shardkit"):
        ShardLoader([str(packed)], batch_size=2, weights=[1]).close()  # generic code's weight: nothing to say
        ShardLoader(str(packed), batch_size=2).close()
    assert not [r for r in caplog.records if "change" in r.getMessage()]
    with caplog.at_level("WARNING", logger="shardkit"):
        ShardLoader(str(packed), batch_size=2, weights=[0.5], disjoint_labels=True).close()
    said = [r.getMessage() for r in caplog.records]
    assert any("weights on one dataset change nothing" in m for m in said)
    assert any("disjoint_labels changes nothing on one dataset" in m for m in said)


def test_disjoint_labels_over_shared_class_names_are_said(packed: Path, other: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="shardkit"):
        loader = ShardLoader([str(packed), other], batch_size=2, disjoint_labels=True)
    loader.close()
    assert loader.classes == ("c000", "c001", "c002", "c000", "c001")
    said = [r.getMessage() for r in caplog.records if "disjoint_labels" in r.getMessage()]
    assert len(said) == 1 and "2 class names appear in more than one dataset ('c000', 'c001')" in said[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": [1.0]}, "weights has 1 entries for 2 datasets"),
        ({"weights": [1.0, 0]}, "the weight of dataset .*mix-b.* must be a positive finite number, got 0"),
        ({"weights": 0.5}, "sequence of numbers"),
        ({"weights": [1.0, 1e-6]}, "gives it 0 of an epoch's 89 samples"),
        ({"disjoint_labels": "yes"}, "disjoint_labels must be True or False"),
    ],
)
def test_bad_mix_arguments_are_refused(packed: Path, other: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(LoaderError, match=match):
        ShardLoader([str(packed), other], batch_size=2, **{"disjoint_labels": True, **kwargs})


def test_bad_dataset_lists_are_refused(packed: Path) -> None:
    with pytest.raises(LoaderError, match="non-empty list"):
        ShardLoader([], batch_size=2)
    with pytest.raises(LoaderError, match="each dataset must be a path or URL"):
        ShardLoader([str(packed), 3], batch_size=2)  # type: ignore[list-item]
    with pytest.raises(LoaderError, match=r"^dataset must be a str path or URL, got bytes b'/"):
        ShardLoader(str(packed).encode(), batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(LoaderError, match="weights has 2 entries for 1 datasets"):
        ShardLoader(str(packed), batch_size=2, weights=[1, 2])
    with ShardLoader([str(packed)], batch_size=2, weights=[3]) as single:  # one dataset: no mix
        assert single.mix is None and single.state_dict()["mix"] is None


@pytest.fixture(scope="module")
def cocos(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two generated COCO sets with the same categories (6 and 9 images)."""
    root = tmp_path_factory.mktemp("mix-coco")
    out = []
    for images, seed in ((6, 3), (9, 4)):
        src, ann = make_coco(root / f"gen{seed}", images=images, seed=seed)
        pack_coco(str(src), str(ann), str(root / f"ds{seed}"), options=PackOptions(max_count=4), workers=1)
        out.append(str(root / f"ds{seed}"))
    return out


def test_coco_datasets_mix_and_resume(cocos: list[str], packed: Path) -> None:
    options: dict[str, Any] = {"batch_size": 2, "weights": [2, 1], "keys": True, "seed": 1, "drop_last": True}
    with ShardLoader(cocos, **options) as loader:
        assert loader.mix is not None and loader.mix.quotas == [10, 5] and len(loader) == 7
        whole = [key for _, _, keys in loader for key in keys]
        loader.set_epoch(0)
        it = iter(loader)
        head = [key for _ in range(3) for key in next(it)[2]]
        state = loader.state_dict()
    with ShardLoader(cocos, **options) as resumed:
        resumed.load_state_dict(state)
        assert head + [key for _, _, keys in resumed for key in keys] == whole
    with pytest.raises(LoaderError, match="cannot mix datasets of different kinds"):
        ShardLoader([cocos[0], str(packed)], batch_size=2)
    with pytest.raises(LoaderError, match="disjoint_labels is for ImageFolder datasets"):
        ShardLoader(cocos, batch_size=2, disjoint_labels=True)


def test_coco_datasets_with_other_categories_are_refused_naming_the_fields(cocos: list[str], tmp_path: Path) -> None:
    """A category that differs (here, keypoints and a skeleton as COCO's person has) is named by its
    id and name and the fields that differ, not printed whole."""
    src, ann = make_coco(tmp_path / "gen", images=5, seed=5)
    doc = json.loads(Path(ann).read_text())
    doc["categories"][0].update(keypoints=[f"point{i}" for i in range(17)], skeleton=[[i, i + 1] for i in range(16)])
    Path(ann).write_text(json.dumps(doc))
    pack_coco(str(src), str(ann), str(tmp_path / "ds"), options=PackOptions(max_count=4), workers=1)
    first = doc["categories"][0]
    with pytest.raises(LoaderError) as err:
        ShardLoader([cocos[0], str(tmp_path / "ds")], batch_size=2)
    assert str(err.value) == (
        f"cannot mix COCO datasets with different categories: category 0 is "
        f"{ {'id': first['id'], 'name': first['name']}!r} in {cocos[0]} and "
        f"{ {'id': first['id'], 'name': first['name']}!r} in {tmp_path / 'ds'}, which differ in keypoints, skeleton")
    assert _first_difference("a", [{"id": 1, "supercategory": None}], "b", [{"id": 1}], ("category", "categories")) \
        == "category 0 is {'id': 1} in a and {'id': 1} in b, which differ in supercategory"


def test_a_joined_reader_reads_each_dataset_from_its_own_store(packed: Path, other: str) -> None:
    stores = [locate_dataset(d) for d in (str(packed), other)]
    manifests = [read_manifest(s) for s in stores]
    joined = ShardReader.joined([ReaderPart(s, m.table, 3 * i, 2 if i else None)
                                 for i, (s, m) in enumerate(zip(stores, manifests, strict=True))])
    first = len(manifests[0].shards)
    for i, (store, m) in enumerate(zip(stores, manifests, strict=True)):
        alone = ShardReader(store, m.shards)
        base = first * i
        for shard in (0, len(m.shards) - 1):
            assert joined.read(base + shard, 1) == alone.read(shard, 1)
            assert joined.where(base + shard) == store.path(m.shards[shard].url)
        assert joined.labels_of(base) == ((0, None) if i == 0 else (3, 2))
    joined.close()


def test_a_damaged_shard_of_the_second_dataset_is_named(packed: Path, other: str, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(other, copy)
    shard = sorted(copy.glob("*.tar"))[1]
    whole = shard.read_bytes()
    shard.write_bytes(whole[:1024])  # cut short: its later samples are lost
    with pytest.raises(LoaderError) as err:
        _loader([str(packed), str(copy)], weights=[1, 1], disjoint_labels=True, on_error="raise",
                even_batches=False)
    assert err.value.where == str(shard) and "index.json says" in err.value.message
    shard.write_bytes(whole)
    loader = _loader([str(packed), str(copy)], weights=[1, 1], disjoint_labels=True, on_error="raise",
                     even_batches=False)
    shard.write_bytes(whole[:1024])  # cut short once the loader has checked its files: named when read
    with loader, pytest.raises(LoaderError) as err:
        for _ in loader:
            pass
    assert str(shard) in str(err.value)
