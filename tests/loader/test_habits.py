"""A ``ShardLoader`` call written with ``DataLoader``'s, ``ImageFolder``'s or a transform preset's
habits: taken where the argument changes nothing, else refused with what to write instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import LoaderError, ShardLoader


@pytest.mark.parametrize(("given", "hint"), [
    ({"persistent_workers": "yes"}, "DataLoader's argument persistent_workers='yes', which it does without: its "
                                    "workers stay up from one epoch to the next"),
    ({"prefetch_factor": 4}, "it is prefetch= here"),
    ({"prefetch_factor": 2, "prefetch": 3}, "prefetch_factor=2, which it does without: it is prefetch= here"),
    ({"collate_fn": list}, "the loader joins each batch"),
    ({"sampler": [0, 1]}, "the order comes from shuffle=, seed= and the ranks"),
    ({"timeout": 5}, "as DataLoader's default timeout=0 does"),
    ({"timeout": False}, "timeout=False, which it does without"),
    ({"in_order": False}, "batches always come in the epoch's order"),
    ({"multiprocessing_context": "spawn"}, "multiprocessing.set_start_method"),
    ({"pin_memory_device": "cuda:1", "pin_memory": True, "device": "cuda:0"}, "pass device='cuda[:i]'"),
    ({"num_worker": 2}, "unexpected keyword argument 'num_worker' (did you mean 'num_workers'?)"),
    ({"batchsize": 2}, "unexpected keyword argument 'batchsize' (did you mean 'batch_size'?)"),
    ({"normalize": False}, "'normalize', an option of the transform, not of the loader: "
                           "transform=transforms.imagenet_train(224, normalize=...) (or imagenet_val)"),
    ({"crop_fraction": 1.0}, "'crop_fraction', an option of the transform, not of the loader: "
                             "transform=transforms.imagenet_val(224, crop_fraction=...)"),
    ({"mean": (0.5,) * 3}, "transform=transforms.imagenet_train(224, normalize=(mean, std))"),
    ({"target_transform": int}, "ImageFolder's argument 'target_transform', which it does without: labels come as "
                                "an int64 tensor in each batch"),  # was "did you mean 'text_transform'?"
])
def test_dataloader_habits_are_told_what_to_write(packed: Path, given: dict[str, Any], hint: str) -> None:
    with pytest.raises(TypeError) as info:
        ShardLoader(str(packed), batch_size=4, **given)
    assert str(info.value).startswith("ShardLoader() got ") and hint in str(info.value)


def test_dataloader_arguments_that_change_nothing_are_taken(packed: Path) -> None:
    """A DataLoader call converts by its name: its arguments at values where a DataLoader does what
    the loader does anyway are taken, and the batches are those of the call without them."""
    habits: dict[str, Any] = {"persistent_workers": True, "pin_memory": False, "pin_memory_device": "",
                              "prefetch_factor": 2, "collate_fn": None, "sampler": None, "batch_sampler": None,
                              "generator": None, "worker_init_fn": None, "timeout": 0, "in_order": True,
                              "multiprocessing_context": None}
    with ShardLoader(str(packed), batch_size=4, keys=True, **habits) as loader, \
            ShardLoader(str(packed), batch_size=4, keys=True) as plain:
        assert [keys for *_, keys in loader] == [keys for *_, keys in plain]
    ShardLoader(str(packed), batch_size=4, persistent_workers=False, prefetch=3, prefetch_factor=3,
                timeout=0.0).close()


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 0)])
def test_pin_memory_is_taken_with_a_cuda_device(packed: Path, device: Any) -> None:
    """pin_memory=True is what device='cuda' does: refused on the CPU (above), taken beside a CUDA
    device (checked before any CUDA work: the arguments are read before the route is chosen)."""
    from shardkit.loader.habits import check_dataloader_args

    check_dataloader_args(ShardLoader, {"pin_memory": True, "pin_memory_device": str(device)},
                          {"device": device, "prefetch": 2})
    with pytest.raises(TypeError, match=r"pin_memory_device='cuda:1', which it does without"):
        check_dataloader_args(ShardLoader, {"pin_memory_device": "cuda:1", "pin_memory": True},
                              {"device": "cuda:0", "prefetch": 2})


def test_dataloader_arguments_as_numpy_bools_and_a_pin_device_without_pinning_are_taken(packed: Path) -> None:
    import numpy as np

    numpy_bools: dict[str, Any] = {"persistent_workers": np.True_, "pin_memory": np.False_, "in_order": np.True_}
    ShardLoader(str(packed), batch_size=4, pin_memory_device="cuda", **numpy_bools).close()  # unused unpinned
    with pytest.raises(TypeError, match=r"in_order=np.False_, which it does without"):
        ShardLoader(str(packed), batch_size=4, in_order=np.False_)  # type: ignore[arg-type]


def test_a_subclass_passing_its_keywords_on_still_gets_the_loader_s_hints(packed: Path) -> None:
    class Folder(ShardLoader):
        def __init__(self, path: str, **kwargs: Any) -> None:
            super().__init__(path, batch_size=4, **kwargs)

    with pytest.raises(TypeError, match=r"^Folder\(\) got an unexpected keyword argument 'num_worker' \(did you mean "
                                        r"'num_workers'\?\)$"):
        Folder(str(packed), num_worker=2)
    Folder(str(packed), num_workers=0, persistent_workers=False).close()


def test_pin_memory_on_the_cpu_is_refused_where_cuda_is_and_taken_with_a_warning_where_it_is_not(
        packed: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """As a DataLoader on a machine without a GPU, ``pin_memory=True`` is taken there (a warning
    says nothing is pinned), so code written for a GPU machine runs on a laptop; beside a GPU it
    points at ``device='cuda'``, which is what it asks for."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(TypeError, match=r"pin_memory=True, which it does without: pass device='cuda'"):
        ShardLoader(str(packed), batch_size=4, pin_memory=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level("WARNING", logger="shardkit"), \
            ShardLoader(str(packed), batch_size=4, keys=True, pin_memory=True) as pinned, \
            ShardLoader(str(packed), batch_size=4, keys=True) as plain:
        assert [keys for *_, keys in pinned] == [keys for *_, keys in plain]
    said = [r.getMessage() for r in caplog.records if "pin_memory" in r.getMessage()]
    assert said == ["shardkit: pin_memory=True, but this machine has no CUDA device: nothing is pinned (as "
                    "DataLoader does there); with a GPU, pass device='cuda' instead"]


def test_the_loaders_own_flags_take_numpy_bools_and_refuse_other_values(packed: Path) -> None:
    import numpy as np

    numpy_flags: dict[str, Any] = {"shuffle": np.False_, "drop_last": np.True_}  # as a config gives them
    with ShardLoader(str(packed), batch_size=4, keys=True, **numpy_flags) as loader, \
            ShardLoader(str(packed), batch_size=4, keys=True, shuffle=False, drop_last=True) as plain:
        assert loader.drop_last is True and len(loader) == len(plain) == 17  # 69 samples
        assert [keys for *_, keys in loader] == [keys for *_, keys in plain]
    for flag in ("shuffle", "drop_last", "even_batches", "keys", "read_ahead"):
        with pytest.raises(LoaderError, match=rf"^{flag} must be True or False, got 1$"):
            ShardLoader(str(packed), batch_size=4, **{flag: 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(("rank", "world_size", "drop_last"), [(0, 1, False), (0, 1, True), (0, 2, False),
                                                               (1, 2, False), (2, 3, False), (1, 3, True)])
def test_the_sampler_counts_what_the_rank_yields_and_takes_set_epoch(packed: Path, rank: int, world_size: int,
                                                                     drop_last: bool) -> None:
    """``loader.sampler`` is what DDP scripts and Lightning call ``set_epoch`` on; its ``len`` is
    the samples this rank yields in an epoch (padding included)."""
    with ShardLoader(str(packed), batch_size=8, keys=True, rank=rank, world_size=world_size,
                     drop_last=drop_last) as loader, \
            ShardLoader(str(packed), batch_size=8, keys=True, rank=rank, world_size=world_size,
                        drop_last=drop_last) as other:
        loader.sampler.set_epoch(3)
        other.set_epoch(3)
        keys = [list(k) for *_, k in loader]
        assert keys == [list(k) for *_, k in other] and loader.sampler.epoch == 4  # the next iteration runs 4
        assert len(loader.sampler) == sum(len(k) for k in keys)


def test_the_sampler_yields_no_indices(packed: Path) -> None:
    with ShardLoader(str(packed), batch_size=8) as loader, \
            pytest.raises(TypeError, match=r"^a ShardLoader's sampler yields no indices: the loader reads its shards"):
        iter(loader.sampler)


def test_the_batch_sampler_is_the_loaders_batching_around_the_same_sampler(packed: Path) -> None:
    """Lightning's DeepSpeed strategy reads ``batch_sampler.batch_size``; Lightning's loops look for
    a ``sampler`` behind it and tell samplers apart by identity."""
    from torch.utils.data import SequentialSampler

    with ShardLoader(str(packed), batch_size=8, drop_last=True) as loader:
        batches = loader.batch_sampler
        assert batches.batch_size == 8 and batches.drop_last is True and len(batches) == len(loader) == 8
        assert batches.sampler is loader.sampler and not isinstance(loader.sampler, SequentialSampler)
        with pytest.raises(TypeError, match=r"^a ShardLoader's batch_sampler yields no indices"):
            iter(batches)
    with ShardLoader(str(packed), batch_size=8, shuffle=False) as in_order:  # no false overfit_batches warning
        assert isinstance(in_order.sampler, SequentialSampler) and len(in_order.sampler) == 69


def test_the_samplers_set_epoch_runs_that_epoch_next_as_a_distributed_samplers_does(
        packed: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Lightning's sanity check leaves a validation iteration of epoch 0 open; its
    ``sampler.set_epoch(0)`` before the real validation ran epoch 1 (``loader.set_epoch`` of the
    open iteration's own epoch changes nothing). And a resume point Lightning ends (an epoch cut
    short by ``limit_train_batches``) is not warned about."""
    with ShardLoader(str(packed), batch_size=8, keys=True) as loader, \
            ShardLoader(str(packed), batch_size=8, keys=True) as reference:
        epoch0 = [list(k) for *_, k in reference]
        it = iter(loader)
        next(it), next(it)  # a sanity check of two batches
        loader.sampler.set_epoch(0)
        assert [list(k) for *_, k in loader] == epoch0
        reference.set_epoch(0)
        partial = iter(reference)
        for _ in range(5):
            next(partial)
        state = reference.state_dict()  # epoch 0, 5 batches: where Lightning's limit ended the epoch
        with caplog.at_level("INFO", logger="shardkit"):
            loader.load_state_dict(state)
            loader.sampler.set_epoch(1)
        said = [(r.levelname, r.getMessage()) for r in caplog.records if "drops its resume point" in r.getMessage()]
        assert [level for level, _ in said] == ["INFO"]
        reference.set_epoch(1)
        assert [list(k) for *_, k in loader] == [list(k) for *_, k in reference]
        caplog.clear()
        with caplog.at_level("INFO", logger="shardkit"):
            loader.load_state_dict(state)
            loader.sampler.set_epoch(0)  # the state's own epoch: its resume point kept, nothing said
            loader.load_state_dict({**state, "epoch": 2})
            loader.sampler.set_epoch(1)  # an earlier epoch than the state's: warned
        said = [(r.levelname, r.getMessage()) for r in caplog.records if "drops its resume point" in r.getMessage()]
        assert [level for level, _ in said] == ["WARNING"]


def test_the_samplers_len_follows_the_live_rank(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    loader = ShardLoader(str(packed), batch_size=8, drop_last=True)  # built before the launcher's world
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert len(loader.sampler) == 32  # 69 samples: 4 full batches a rank
    loader.close()


def test_pad_takes_a_numpy_bool(packed: Path) -> None:
    import numpy as np

    with pytest.raises(LoaderError, match=r"^pad=True needs a COCO dataset"):  # taken as True, then judged
        ShardLoader(str(packed), batch_size=8, pad=np.True_)  # type: ignore[arg-type]


def test_a_dropped_elastic_resume_point_says_what_was_left(packed: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After an elastic resume the resume point is batch 0 of what was left: "batch 0" alone read
    as if nothing were lost."""
    with ShardLoader(str(packed), batch_size=8, rank=0, world_size=2) as two:
        batches = iter(two)
        next(batches), next(batches)
        state = two.state_dict()  # 2 ranks x 2 batches: 32 of 69 samples out
    with ShardLoader(str(packed), batch_size=8) as one, caplog.at_level("WARNING", logger="shardkit"):
        one.load_state_dict(state)
        one.set_epoch(1)
    said = [r.getMessage() for r in caplog.records if "drops its resume point" in r.getMessage()]
    assert said == ["shardkit: set_epoch(1) right after load_state_dict drops its resume point (epoch 0, batch 0 of "
                    "what was left of it, 37 samples): epoch 1 runs from its start; set_epoch(loader.epoch) resumes "
                    "where the state stopped"]
