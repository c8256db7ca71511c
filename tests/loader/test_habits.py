"""A ``ShardLoader`` call written with ``DataLoader``'s, ``ImageFolder``'s or a transform preset's
habits: taken where the argument changes nothing, else refused with what to write instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import ShardLoader


@pytest.mark.parametrize(("given", "hint"), [
    ({"persistent_workers": "yes"}, "DataLoader's argument persistent_workers='yes', which it does without: its "
                                    "workers stay up from one epoch to the next"),
    ({"pin_memory": True}, "DataLoader's argument pin_memory=True, which it does without: pass device='cuda'"),
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
