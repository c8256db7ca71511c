"""What frameworks do with a loader besides iterating it, in this process: count the real samples
of padded batches, see an epoch's last batch (accelerate's gradient accumulation), skip batches
(accelerate's ``skip_first_batches``) and wrap it as a dataset (torch's and torchdata's loaders)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from shardkit import LoaderError, ShardLoader

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)


def test_real_samples_drop_the_padding_so_each_sample_counts_once(frames: dict[str, Path]) -> None:
    real_keys, counts = [], []
    for rank in range(2):  # 42 samples, 2 ranks x 6 batches of 4: 6 padding slots on rank 1
        loader = ShardLoader(str(frames["val"]), batch_size=4, rank=rank, world_size=2, keys=True, shuffle=False)
        mine = []
        for i, (_x, _y, keys) in enumerate(loader):
            assert loader.real_samples() == loader.real_samples(i)
            mine.append(loader.real_samples())
            real_keys += keys[: loader.real_samples()]
        counts.append(mine)
    assert counts == [[4] * 6, [4, 4, 4, 4, 2, 0]]
    assert len(real_keys) == 42 and len(set(real_keys)) == 42


def test_real_samples_is_the_batch_length_without_padding(frames: dict[str, Path]) -> None:
    loader = ShardLoader(str(frames["val"]), batch_size=8)  # one rank: a short last batch, as DataLoader
    assert [(len(y), loader.real_samples()) for _x, y in loader][-1] == (2, 2)
    uneven = ShardLoader(str(frames["val"]), batch_size=4, rank=1, world_size=2, even_batches=False)
    assert [loader.real_samples(i) for i in range(len(loader))] == [8, 8, 8, 8, 8, 2]
    assert [len(y) - uneven.real_samples() for _x, y in uneven] == [0] * len(uneven)


def test_real_samples_before_any_batch_names_what_to_do(frames: dict[str, Path]) -> None:
    loader = ShardLoader(str(frames["val"]), batch_size=4)
    with pytest.raises(LoaderError, match="no batch was yielded yet: pass batch_index="):
        loader.real_samples()
    with pytest.raises(LoaderError, match=r"batch index must be in \[0, 11\)"):
        loader.real_samples(11)


def test_end_of_dataloader_is_set_while_the_last_batch_is_out(frames: dict[str, Path]) -> None:
    loader = ShardLoader(str(frames["train"]), batch_size=8)
    seen = [loader.end_of_dataloader for _ in loader]
    assert seen == [False] * 5 + [True] and not loader.end_of_dataloader
    assert loader.remainder == 0  # nothing for gather_for_metrics to cut


@pytest.fixture
def accelerator() -> Iterator[object]:
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    yield accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_accelerate_sees_the_epoch_end_and_steps_there(frames: dict[str, Path], accelerator: object) -> None:
    import torch

    acc = accelerator
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)  # type: ignore[attr-defined]
    loader = ShardLoader(str(frames["train"]), batch_size=8)  # 6 batches
    assert acc.prepare(loader) is loader  # type: ignore[attr-defined]
    stepped: list[list[int]] = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        stepped.append([])
        for i, _batch in enumerate(loader):
            with acc.accumulate(model):  # type: ignore[attr-defined]
                if acc.sync_gradients:  # type: ignore[attr-defined]
                    stepped[-1].append(i)
    assert stepped == [[3, 5], [3, 5]]  # without the end signal: [[3], [1, 5]]
    from accelerate.state import GradientState

    assert not GradientState().in_dataloader  # withdrawn when the epoch ended


def test_skip_first_batches_fails_in_one_line_pointing_to_state_dict(frames: dict[str, Path],
                                                                     accelerator: object) -> None:
    from accelerate import skip_first_batches

    loader = ShardLoader(str(frames["train"]), batch_size=8)
    with pytest.raises(AttributeError) as err:
        skip_first_batches(loader, 3)
    assert "load_state_dict" in str(err.value) and "state_dict()" in str(err.value) and "\n" not in str(err.value)
    assert not hasattr(loader, "dataset")


def test_wrapping_in_a_dataloader_says_what_to_do_instead(frames: dict[str, Path]) -> None:
    loader = ShardLoader(str(frames["train"]), batch_size=8)
    with pytest.raises(TypeError, match="ShardLoader is a loader, not a dataset: iterate it directly"):
        next(iter(DataLoader(loader)))  # type: ignore[arg-type]


def test_wrapping_in_a_stateful_dataloader_says_what_to_do_instead(frames: dict[str, Path]) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = ShardLoader(str(frames["train"]), batch_size=8)
    with pytest.raises(TypeError, match="instead of wrapping it in DataLoader or StatefulDataLoader"):
        next(iter(stateful.StatefulDataLoader(loader)))


def test_torch_distributed_checkpoint_saves_and_loads_the_loader_exactly_an_elastic_resume_too(
        frames: dict[str, Path], tmp_path: Path) -> None:
    """DCP loads a checkpoint into the keys of the state a fresh loader gives: a state holding a
    ``remainder`` (after an elastic resume) lost it, and the rest of the epoch re-delivered what
    was trained; one from 2 ranks (``even_batches`` at its default, left out) was refused by a
    loader of one rank ("Missing key in checkpoint state_dict: loader.even_batches")."""
    import torch.distributed.checkpoint as dcp

    train = str(frames["train"])  # 48 samples
    two = ShardLoader(train, batch_size=4, rank=0, world_size=2, keys=True, seed=3)
    batches = iter(two)
    for _ in range(3):
        next(batches)
    dcp.save({"loader": two}, checkpoint_id=str(tmp_path / "two"))  # 2 ranks x 3 batches: 24 samples trained
    one = ShardLoader(train, batch_size=4, keys=True, seed=3)
    dcp.load({"loader": one}, checkpoint_id=str(tmp_path / "two"))  # elastic: 2 ranks -> 1
    rest = iter(one)
    first = list(next(rest)[2])
    dcp.save({"loader": one}, checkpoint_id=str(tmp_path / "one"))  # its state holds the remainder
    after = [k for *_, keys in rest for k in keys]
    again = ShardLoader(train, batch_size=4, keys=True, seed=3)
    dcp.load({"loader": again}, checkpoint_id=str(tmp_path / "one"))
    assert [k for *_, keys in again for k in keys] == after
    assert len(first + after) == 24 and len(set(first + after)) == 24  # the 24 no rank had reached
