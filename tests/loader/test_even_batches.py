"""``even_batches=False`` (evaluation): every sample exactly once over all ranks, the last batch
short, ``len`` true per rank; for any world size, worker count, batch size, dataset size and
shuffle; resumable mid-epoch; real gloo ranks; COCO. torchvision's ``ImageFolder`` over the same
source tree defines what the samples are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchvision.datasets import ImageFolder

from sample_data.coco_gen import make_coco
from sample_data.generate import decode_index, make_indexed_imagefolder
from shardkit import ShardLoader, transforms
from shardkit.pack import PackOptions, pack, pack_coco
from tests.ports import free_port
from tests.ranks import gloo, write_gathered

Delivered = list[tuple[str, int, int]]  # (key, label, index decoded from the pixels) per sample


@pytest.fixture(scope="module")
def datasets(packed: Path, indexed_tree: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, Path]]:
    """``number of samples -> (ImageFolder source tree, packed dataset)``: 1, 14 and 69 samples."""
    root = tmp_path_factory.mktemp("sizes")
    out = {69: (indexed_tree, packed)}
    for classes, per_class in ((1, 1), (2, 7)):
        src, dst = root / f"src{classes}", root / f"ds{classes}"
        make_indexed_imagefolder(src, classes=classes, per_class=per_class, size=(40, 32))
        pack(str(src), str(dst), options=PackOptions(max_count=4, seed=2), workers=1)
        out[classes * per_class] = (src, dst)
    return out


def _loader(dataset: Path, **kw: Any) -> ShardLoader:
    args: dict[str, Any] = {"batch_size": 8, "transform": transforms.imagenet_val(32), "keys": True,
                            "even_batches": False, "seed": 3}
    return ShardLoader(str(dataset), **(args | kw))


def _deliver(loader: ShardLoader) -> list[Delivered]:
    """Every batch of one epoch, as ``(key, label, decoded index)`` per sample."""
    return [[(k, int(y), decode_index(x)) for x, y, k in zip(images, labels, keys, strict=True)]
            for images, labels, keys in loader]


def _check_once(per_rank: list[list[Delivered]], reference: ImageFolder, batch_size: int) -> None:
    """The union over ranks is the dataset exactly once, with ImageFolder's labels and pixels."""
    batches = [b for rank in per_rank for b in rank]
    samples = [s for b in batches for s in b]
    assert sorted(index for _, _, index in samples) == list(range(len(reference)))
    for key, label, index in samples:
        assert int(key) == index and label == reference.targets[index]
    assert all(len(b) == batch_size for b in batches[:-1]) and 0 < len(batches[-1]) <= batch_size
    counts = [len(rank) for rank in per_rank]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.sampled_from([1, 14, 69]), world=st.integers(1, 6), batch_size=st.integers(1, 40),
       shuffle=st.booleans())
def test_every_sample_once_over_ranks(datasets: dict[int, tuple[Path, Path]], size: int, world: int,
                                      batch_size: int, shuffle: bool) -> None:
    src, dataset = datasets[size]
    per_rank = []
    for rank in range(world):
        loader = _loader(dataset, batch_size=batch_size, shuffle=shuffle, rank=rank, world_size=world)
        delivered = _deliver(loader)
        assert len(delivered) == len(loader)  # len is this rank's true count
        per_rank.append(delivered)
    _check_once(per_rank, ImageFolder(str(src)), batch_size)


@pytest.mark.parametrize(("world", "workers", "batch_size", "shuffle"),
                         [(1, 2, 8, True), (2, 3, 5, False), (3, 2, 8, True), (4, 2, 32, False)])
def test_workers_deliver_the_same_samples_once(datasets: dict[int, tuple[Path, Path]], world: int, workers: int,
                                               batch_size: int, shuffle: bool) -> None:
    src, dataset = datasets[69]
    per_rank = []
    for rank in range(world):
        common = dict(batch_size=batch_size, shuffle=shuffle, rank=rank, world_size=world)
        with _loader(dataset, num_workers=workers, **common) as loader:
            delivered = _deliver(loader)
        assert len(delivered) == len(loader) and delivered == _deliver(_loader(dataset, **common))
        per_rank.append(delivered)
    _check_once(per_rank, ImageFolder(str(src)), batch_size)


def test_default_still_pads_ranks_to_equal_batches(datasets: dict[int, tuple[Path, Path]]) -> None:
    _, dataset = datasets[69]
    even = [_deliver(_loader(dataset, even_batches=True, rank=r, world_size=4)) for r in range(4)]
    assert {len(b) for b in even} == {3} and sum(len(b) for rank in even for b in rank) == 96  # 27 repeats


def test_resume_mid_epoch_on_every_rank(datasets: dict[int, tuple[Path, Path]]) -> None:
    """69 samples, batches of 8, 4 ranks: 9 batches, 2/2/2/3 per rank. A state taken after ``k``
    steps (on rank 0, or on the last rank once rank 0 is done) resumes every rank in fresh
    loaders with other worker counts at exactly the batches it had not delivered, then the
    next epoch runs as uninterrupted."""
    _, dataset = datasets[69]
    world = 4

    def make(rank: int, workers: int) -> ShardLoader:
        return _loader(dataset, rank=rank, world_size=world, num_workers=workers)

    full = []
    for rank in range(world):
        loader = make(rank, 0)
        loader.set_epoch(5)
        full.append((_deliver(loader), _deliver(loader)))  # epochs 5 and 6
    steps = max(len(epoch) for epoch, _ in full)
    assert [len(epoch) for epoch, _ in full] == [2, 2, 2, 3] and steps == 3
    for k in range(steps + 1):
        last = make(world - 1, 2)
        last.set_epoch(5)
        it = iter(last)
        for _ in range(k):
            next(it)
        state = last.state_dict()
        if k <= len(full[0][0]):  # rank 0 still in the epoch: its state is the same
            first = make(0, 0)
            first.set_epoch(5)
            it0 = iter(first)
            for _ in range(k):
                next(it0)
            assert first.state_dict() == state
        assert json.loads(json.dumps(state)) == state and state["even_batches"] is False
        for rank in range(world):
            resumed = make(rank, 1 if rank % 2 else 0)
            resumed.load_state_dict(state)
            tail = []
            for epoch in range(resumed.epoch, 7):
                resumed.set_epoch(epoch)
                tail += _deliver(resumed)
            epoch5, epoch6 = full[rank]
            expected = epoch5[min(k, len(epoch5)):] + epoch6 if k < steps else epoch6
            assert tail == expected, (k, rank)
            resumed.close()
        last.close()


def test_state_of_an_uneven_loader_resumes_in_an_even_one(datasets: dict[int, tuple[Path, Path]]) -> None:
    """Another layout is an elastic resume: the even loader starts the epoch's rest at its batch 0."""
    _, dataset = datasets[69]
    state = _loader(dataset, rank=0, world_size=2).state_dict() | {"batches_consumed": 1}
    even = _loader(dataset, rank=0, world_size=2, even_batches=True)
    even.load_state_dict(state)
    assert even.state_dict()["remainder"] and even.state_dict()["batches_consumed"] == 0


def _eval_rank(rank: int, world: int, port: int, dataset: str, out: str) -> None:
    """An evaluation pass as a user writes it: per-rank sums, one all_reduce after the loop."""
    with gloo(rank, world, port):
        loader = ShardLoader(dataset, batch_size=8, transform=transforms.imagenet_val(32), keys=True,
                             num_workers=0, shuffle=False, even_batches=False)  # rank/world from the group
        keys: list[str] = []
        labels_sum = torch.zeros(2, dtype=torch.int64)  # [sum of labels, samples]
        for _, labels, batch_keys in loader:
            keys += batch_keys
            labels_sum += torch.tensor([int(labels.sum()), len(labels)])
        loader.close()
        dist.all_reduce(labels_sum)
        write_gathered(out, {"keys": keys, "len": len(loader), "sums": labels_sum.tolist()})


def test_gloo_ranks_evaluate_each_sample_once(datasets: dict[int, tuple[Path, Path]], tmp_path: Path) -> None:
    src, dataset = datasets[69]
    world, out = 2, tmp_path / "eval.json"  # 9 batches of 8 (the last of 5): 4 on rank 0, 5 on rank 1
    mp.start_processes(_eval_rank, args=(world, free_port(), str(dataset), str(out)), nprocs=world, join=True,
                       start_method="spawn")
    results = json.loads(out.read_text())
    reference = ImageFolder(str(src))
    keys = [k for r in results for k in r["keys"]]
    assert sorted(keys) == [f"{i:08d}" for i in range(69)]
    assert [r["len"] for r in results] == [-(-len(r["keys"]) // 8) for r in results] == [4, 5]
    assert all(r["sums"] == [sum(reference.targets), 69] for r in results)  # reduced over ranks: each once


def test_coco_evaluation_sees_each_image_once(tmp_path: Path) -> None:
    images, ann = make_coco(tmp_path / "coco", images=25, seed=4)
    dataset = tmp_path / "packed"
    pack_coco(str(images), str(ann), str(dataset), options=PackOptions(max_count=6), workers=1)
    ids = sorted(image["id"] for image in json.loads(ann.read_text())["images"])
    assert len(ids) == 25

    def image_ids(**kw: Any) -> list[int]:
        out = []
        for rank in range(2):
            loader = ShardLoader(str(dataset), batch_size=4, transform=transforms.detection_val(), shuffle=False,
                                 rank=rank, world_size=2, **kw)
            batches = [[int(t["image_id"]) for t in targets] for _, targets in loader]
            assert len(batches) == len(loader)
            out += [i for b in batches for i in b]
        return out

    assert len(image_ids()) == 32  # the default pads with repeats: mAP would count 7 images twice
    assert sorted(image_ids(even_batches=False)) == ids
    assert sorted(image_ids(even_batches=False, num_workers=2)) == ids


def test_uneven_ranks_are_said_once_as_a_training_loop_iterates(packed: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A DDP training step (its all-reduce), accelerate's gather_for_metrics or any collective per
    batch waits forever on a rank with no batch left (gloo fails, NCCL hangs) where
    even_batches=False gives ranks different counts: said once per loader, and only then; not in
    an evaluation loop (under no_grad), what even_batches=False is for."""
    uneven = ShardLoader(str(packed), batch_size=8, rank=1, world_size=2, even_batches=False)  # 69: 9 batches
    even = ShardLoader(str(packed), batch_size=8, rank=1, world_size=2)  # equal counts
    alike = ShardLoader(str(packed), batch_size=23, rank=1, world_size=3, even_batches=False)  # 3 x 1
    with caplog.at_level("WARNING", logger="shardkit.loader"):
        with torch.no_grad():
            assert sum(1 for _ in uneven) == len(uneven)
        assert caplog.records == []
        for loader in (uneven, uneven, even, alike):
            assert sum(1 for _ in loader) == len(loader)
    assert [r.getMessage() for r in caplog.records] == [
        "shardkit: with even_batches=False the ranks get 4 or 5 batches an epoch (this one 5): if this loop trains, "
        "a DDP step, a gather_for_metrics or any collective per batch waits forever on a rank with none left (train "
        "with even_batches=True, or under DDP's join()); an evaluation loop counts per rank and gathers once after "
        "it, under torch.no_grad(), which also keeps this quiet (docs: evaluation)"]


def test_an_evaluation_that_reads_the_epochs_end_per_batch_is_told_of_uneven_ranks(
        packed: Path, caplog: pytest.LogCaptureFixture) -> None:
    """accelerate's ``gather_for_metrics`` reads ``end_of_dataloader`` after each batch's gather:
    a collective per batch, which waits forever on the rank with a batch more, under no_grad too.
    An evaluation that gathers once after its loop reads nothing and is told nothing."""
    uneven = ShardLoader(str(packed), batch_size=8, rank=1, world_size=2, even_batches=False)  # 4 or 5 batches
    with caplog.at_level("WARNING", logger="shardkit.loader"), torch.no_grad():
        assert sum(1 for _ in uneven) == 5
        assert caplog.records == []
        assert uneven.end_of_dataloader is False  # read outside an iteration: nothing to say
        for _batch in uneven:
            _ = uneven.end_of_dataloader  # as gather_for_metrics reads it, per batch
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("shardkit: with even_batches=False the ranks get 4 or 5 batches")
