"""ShardLoader end to end on packed indexed trees: labels, order, epochs, resume, bad data."""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from torchvision.datasets import ImageFolder

from sample_data.generate import decode_index
from shardkit import LoaderError, ShardLoader, transforms
from shardkit.format.spec import offsets_name
from shardkit.index import read_manifest
from shardkit.storage import Store


def _run(loader: ShardLoader) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    return [(x.clone(), y.clone(), list(k)) for x, y, k in loader]


def _loader(packed: Path, **kw: object) -> ShardLoader:
    args: dict[str, object] = {"batch_size": 8, "transform": transforms.imagenet_train(32), "keys": True}
    args.update(kw)
    return ShardLoader(str(packed), **args)  # type: ignore[arg-type]


def test_labels_and_pixels_match_torchvision_imagefolder(packed: Path, indexed_tree: Path) -> None:
    reference = ImageFolder(str(indexed_tree))
    loader = _loader(packed, transform=transforms.imagenet_val(32), shuffle=False, drop_last=False)
    seen = {}
    for images, labels, keys in loader:
        for image, label, key in zip(images, labels, keys, strict=True):
            index = int(key)  # keys are the sample's index in ImageFolder order
            seen[index] = key
            assert label.item() == reference.targets[index]
            assert decode_index(image) == index
    assert sorted(seen) == list(range(len(reference)))
    assert list(loader.classes or ()) == reference.classes and loader.class_to_idx == reference.class_to_idx


def test_shuffle_false_is_manifest_order_and_epochs_differ_when_shuffled(packed: Path) -> None:
    manifest = json.loads((packed / "index.json").read_text())
    plain = [k for _, _, keys in _loader(packed, shuffle=False) for k in keys]
    expected = []
    for shard in manifest["shards"]:
        lines = (packed / offsets_name(shard["url"])).read_text().splitlines()[1:]
        expected += [line.split()[0] for line in lines]
    assert plain[: len(expected)] == expected
    shuffled = _loader(packed, seed=3)
    first = [k for _, _, keys in shuffled for k in keys]
    second = [k for _, _, keys in shuffled for k in keys]
    assert first != second and set(first) == set(second)
    assert shuffled.epoch == 2


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_output_does_not_depend_on_worker_count(packed: Path, num_workers: int) -> None:
    reference = _run(_loader(packed, num_workers=0))
    got = _run(_loader(packed, num_workers=num_workers))
    assert [k for *_, k in got] == [k for *_, k in reference]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, reference, strict=True))


def _draws(image: torch.Tensor) -> torch.Tensor:
    """A transform drawing from every global generator a library may use."""
    import numpy as np

    return torch.tensor([random.randrange(1 << 30), int(np.random.randint(1 << 30)), int(torch.randint(1 << 30, ()))])


def test_a_transforms_random_and_numpy_draws_resume_and_ignore_the_worker_count(packed: Path) -> None:
    """Only torch's generator was seeded per sample: a transform drawing from random or numpy
    (your own) drew other numbers on resume and with another worker count."""
    def loader(workers: int) -> ShardLoader:
        return ShardLoader(str(packed), batch_size=4, transform=_draws, num_workers=workers, seed=3)

    draws = [images for images, _labels in loader(0)]
    assert torch.equal(torch.cat(draws), torch.cat([images for images, _labels in loader(2)]))
    first = loader(2)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    first.close()
    resumed = loader(1)
    resumed.load_state_dict(state)
    assert torch.equal(torch.cat([images for images, _labels in resumed]), torch.cat(draws[3:]))
    rows = torch.cat(draws)
    assert len({tuple(row.tolist()) for row in rows}) == len(rows)  # each sample its own numbers
    before = random.getstate()
    list(loader(0))  # the caller's own generators are left as they were
    assert random.getstate() == before


@pytest.mark.parametrize("workers", [0, 2])
def test_the_training_loops_torch_random_numbers_are_those_it_would_draw_without_the_loader(
        packed: Path, workers: int) -> None:
    """With workers, the DataLoader inside drew their base seed from torch's global generator: a
    loop seeded with torch.manual_seed drew other numbers (dropout, its own sampling) than with
    num_workers=0 or no loader at all."""
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with ShardLoader(str(packed), batch_size=4, num_workers=workers, seed=3) as loader:
        for _ in loader:
            pass
        for _ in loader:  # a second epoch, the same persistent workers
            pass
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("drop_last", [True, False])
def test_len_and_exact_epoch(packed: Path, drop_last: bool) -> None:
    loader = _loader(packed, drop_last=drop_last)
    batches = _run(loader)
    assert len(batches) == len(loader)
    keys = [k for *_, ks in batches for k in ks]
    if drop_last:
        assert all(len(ks) == 8 for *_, ks in batches)
        assert len(set(keys)) == len(keys) == 64
    else:  # one rank: every sample once, the last batch short (as DataLoader)
        assert [len(ks) for *_, ks in batches] == [8] * 8 + [5]
        assert sorted(keys) == [f"{i:08d}" for i in range(69)]


def test_len_of_dataset_points_to_the_sample_count(packed: Path) -> None:
    # A DataLoader's len(loader.dataset) counts samples; a ShardLoader has no dataset (frameworks read
    # hasattr as False), and its error spoke of skip_first_batches alone.
    loader = _loader(packed, num_workers=0)
    with pytest.raises(AttributeError) as caught:
        len(loader.dataset)
    said = str(caught.value)
    assert "loader.manifest.num_samples" in said and "len(loader)" in said and "load_state_dict" in said
    assert "\n" not in said and said.count(". ") == 0
    assert not hasattr(loader, "dataset")
    assert loader.manifest.num_samples == 69 == len({k for *_, ks in _run(loader) for k in ks})
    assert "manifest.num_samples" in (ShardLoader.__doc__ or "")


def test_resume_at_random_steps_equals_uninterrupted_run(packed: Path) -> None:
    loader = _loader(packed, num_workers=2, seed=5)
    loader.set_epoch(1)
    reference = _run(loader)
    for step in random.Random(0).sample(range(len(reference) + 1), 4):
        first = _loader(packed, num_workers=2, seed=5)
        first.set_epoch(1)
        it = iter(first)
        for _ in range(step):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = _loader(packed, num_workers=1, seed=5)  # a different worker count
        resumed.load_state_dict(state)
        rest = _run(resumed)
        if step == len(reference):  # a finished epoch resumes at the next one
            assert state["epoch"] == 1 and rest and resumed.epoch == 3
            continue
        assert [k for *_, k in rest] == [k for *_, k in reference[step:]]
        assert all(torch.equal(a[0], b[0]) for a, b in zip(rest, reference[step:], strict=True))


def test_state_for_another_configuration_is_refused(packed: Path) -> None:
    state = _loader(packed).state_dict()
    with pytest.raises(LoaderError, match="seed"):
        _loader(packed, seed=99).load_state_dict(state)
    with pytest.raises(LoaderError):
        _loader(packed).load_state_dict({**state, "version": 99})


def test_world_size_splits_evenly(packed: Path) -> None:
    per_rank = [[k for *_, ks in _loader(packed, rank=r, world_size=3, seed=2) for k in ks] for r in range(3)]
    assert len({len(p) for p in per_rank}) == 1
    assert set().union(*map(set, per_rank)) == {f"{i:08d}" for i in range(69)}


def _copy(packed: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(packed, dst)
    return dst


def _corrupt_first_image(ds: Path) -> str:
    """Overwrite the first sample's image bytes in shard 0 with garbage; return its key."""
    shard = ds / "shard-000000.tar"
    raw = bytearray(shard.read_bytes())
    key, offset, *_ = (ds / "shard-000000.idx").read_text().splitlines()[1].split()
    start = int(offset) + 512  # cls member header; its data block follows, then the jpg
    jpg_header = start + 512
    size = int(raw[jpg_header + 124 : jpg_header + 135], 8)
    raw[jpg_header + 512 : jpg_header + 512 + size] = b"\x00" * size
    shard.write_bytes(bytes(raw))
    return key


def test_corrupt_image_is_replaced_and_counted_or_raises(packed: Path, tmp_path: Path) -> None:
    ds = _copy(packed, tmp_path)
    key = _corrupt_first_image(ds)
    loader = _loader(ds, shuffle=False, batch_size=69)
    ((images, labels, keys),) = _run(loader)
    assert key not in keys and loader.stats.replaced == 1 and len(keys) == 69
    with pytest.raises(LoaderError, match=key):
        _run(_loader(ds, shuffle=False, on_error="raise"))


def test_a_shard_cut_short_or_missing_is_named_when_the_loader_is_built(packed: Path, tmp_path: Path) -> None:
    ds = _copy(packed, tmp_path)
    shard = ds / "shard-000001.tar"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:2000])
    with pytest.raises(LoaderError) as err:
        _loader(ds, shuffle=False, num_workers=2)  # before any worker starts or any batch is read
    assert str(err.value) == (f"{shard}: shard has 2,000 bytes, index.json says {size:,} (cut short, or replaced "
                              "without packing or indexing again); shardkit verify checks every shard")
    shard.unlink()
    (ds / "shard-000000.tar").unlink()
    with pytest.raises(LoaderError, match=r"^.*shard-000000\.tar: shard is missing \(index.json lists it with [0-9,]+ "
                                          r"bytes\); 1 more of the \d+ shards is damaged too; shardkit verify"):
        _loader(ds)


@pytest.mark.parametrize("layout", ["large", "a node's second rank"])
def test_a_shard_cut_short_where_not_every_file_is_checked_up_front_is_named_when_read(
        packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    if layout == "large":  # a stat per shard would cost seconds: checked as opened
        monkeypatch.setattr("shardkit.loader.read.claims.CHECKED_WHOLE", 1)
    else:  # the node's first rank checks every file (one stat per shard and node on a shared file system)
        monkeypatch.setenv("LOCAL_RANK", "1")
    ds = _copy(packed, tmp_path)
    shard = ds / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:2000])
    loader = _loader(ds, shuffle=False, num_workers=2)
    with pytest.raises(LoaderError, match="shard-000001.tar"):
        _run(loader)


def test_missing_offsets_file_falls_back_to_scanning(packed: Path, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    ds = _copy(packed, tmp_path)
    (ds / "shard-000001.idx").unlink()
    loader = _loader(ds, num_workers=2, drop_last=False)
    with caplog.at_level(logging.WARNING, logger="shardkit.loader"):
        assert [k for *_, k in _run(loader)] == [k for *_, k in _run(_loader(packed, drop_last=False))]
        _run(loader)  # a second epoch says nothing more
    said = [r.getMessage() for r in caplog.records if "no offsets file" in r.getMessage()]
    assert len(said) == 1 and "checked neither against their CRC-32 nor by the shard's sha256" in said[0]
    shard = read_manifest(Store(str(ds))).shards[1]
    assert loader.stats.unchecked == 2 * shard.num_samples  # the samples of that shard, in two epochs
    caplog.clear()
    hashed = _loader(ds, verify_hashes=True)  # the shard's sha256 covers its samples: nothing to say
    with caplog.at_level(logging.WARNING, logger="shardkit.loader"):
        _run(hashed)
    assert hashed.stats.unchecked == 0 and not [r for r in caplog.records if "no offsets file" in r.getMessage()]


def test_plain_callable_and_no_transform(packed: Path) -> None:
    def fixed(image: torch.Tensor) -> torch.Tensor:
        return image[:, :16, :16].float()

    images, labels = next(iter(ShardLoader(str(packed), batch_size=4, transform=fixed)))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32 and labels.dtype == torch.int64
    raw, _ = next(iter(ShardLoader(str(packed), batch_size=4)))
    assert isinstance(raw, list) and raw[0].shape == (3, 48, 64)


def test_normalize_preset_finalizes_batches(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_val(32, normalize=True))
    images, _ = next(iter(loader))
    assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32)


def test_a_transform_maker_in_place_of_the_transform_is_refused_at_once(packed: Path) -> None:
    for maker, said in ((transforms.imagenet_train, "transform=imagenet_train makes a transform: call it, e.g. "
                                                    "transform=imagenet_train(224)"),
                        (transforms.RandomResizedCropFlip, "transform=RandomResizedCropFlip is a class: pass an "
                                                           "instance of it")):
        with pytest.raises(LoaderError, match=re.escape(said)):
            ShardLoader(str(packed), batch_size=4, transform=maker)

    class Scaled:  # a class whose constructor returns the result is a transform itself
        def __new__(cls, image: torch.Tensor) -> torch.Tensor:  # type: ignore[misc]
            return image.float() / 255

    images, _ = next(iter(ShardLoader(str(packed), batch_size=4, transform=Scaled)))
    assert images.dtype == torch.float32 and float(images.max()) <= 1.0


def test_bad_arguments(packed: Path, tmp_path: Path) -> None:
    with pytest.raises(LoaderError):
        ShardLoader(str(packed), batch_size=0)
    with pytest.raises(LoaderError):
        ShardLoader(str(packed), batch_size=4, rank=3, world_size=2)
    with pytest.raises(Exception, match="index.json"):
        ShardLoader(str(tmp_path), batch_size=4)


def test_more_workers_than_cores_is_said_once_in_the_loaders_words(packed: Path, caplog: pytest.LogCaptureFixture
                                                                   ) -> None:
    """Not as torch's warning about a DataLoader the user never made."""
    import warnings

    from shardkit.machine import auto_workers, cores_of_this_process

    too_many = cores_of_this_process() + 1
    with caplog.at_level(logging.WARNING, logger="shardkit.loader"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = _loader(packed, num_workers=too_many)
        _run(loader)
        _run(loader)
    said = [r.getMessage() for r in caplog.records if "cores that are this process's share" in r.getMessage()]
    assert said == [f"shardkit: num_workers={too_many} is more than the {too_many - 1} cores that are this process's "
                    "share: "
                    f"the workers take turns on them (num_workers='auto' picks {auto_workers()})"]
    assert not [w for w in seen if "DataLoader will create" in str(w.message)]


def test_a_bad_local_world_size_does_not_stop_a_loader_with_a_worker_count(packed: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "")  # what a launcher wrote wrong matters to num_workers="auto" only
    assert len(_run(_loader(packed, num_workers=0))) > 0
    assert len(_run(_loader(packed, num_workers=2))) > 0


def test_a_transform_spawned_workers_cannot_take_is_named_in_one_line(packed: Path, tmp_path: Path) -> None:
    """Workers started by 'spawn' (or forkserver: Python 3.14's default on Linux) get the transform
    pickled: a lambda was torch's PicklingError from deep in DataLoader's start."""
    from tests.scripts import run_script_file

    run = run_script_file(tmp_path / "train.py", "import multiprocessing, shardkit\n"
                                                 "if __name__ == '__main__':\n"
                                                 "    multiprocessing.set_start_method('spawn')\n"
                                                 f"    loader = shardkit.ShardLoader({str(packed)!r}, batch_size=4, "
                                                 "num_workers=2, transform=lambda image: image)\n"
                                                 "    try:\n"
                                                 "        next(iter(loader))\n"
                                                 "    except shardkit.LoaderError as err:\n"
                                                 "        print(err)\n")
    assert run.returncode == 0, run.stderr[-2000:]
    said = run.stdout.strip()
    assert said.startswith("the worker processes start by 'spawn', which sends them the loader's transform and "
                           "other arguments pickled, and one cannot be: ") and "lambda" in said
    assert said.endswith("(locks, open files) out of them, or pass num_workers=0")
