"""What a worker sends the training process: an output that cannot be pickled, at the first batch
or later, is a LoaderError naming the sample, never a loop waiting for a batch torch's queue thread
dropped; a loader iterated inside another DataLoader's worker yields its batches as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sample_data.indexed import decode_index
from shardkit import LoaderError, ShardLoader, transforms
from tests.loader.run.test_lifecycle import _loader


class _Unsendable:
    """What a transform might return that cannot be pickled (a lambda inside)."""

    def __init__(self) -> None:
        self.call = lambda: 0


def _unsendable(image: object) -> _Unsendable:
    return _Unsendable()


def test_a_transform_output_that_cannot_leave_a_worker_is_an_error_not_a_hang(packed: Path) -> None:
    """torch's queue thread only prints a pickling error, and the loop would wait for the batch
    forever; the worker names the sample and what the transform returned instead."""
    with (_loader(packed, num_workers=1, transform=_unsendable) as loader,
          pytest.raises(LoaderError, match="the transform returned a _Unsendable, which cannot be sent") as info):
        next(iter(loader))
    assert "shard-" in info.value.where
    with _loader(packed, num_workers=0, transform=_unsendable) as here:  # nothing to send: it works
        assert isinstance(next(iter(here))[0][0], _Unsendable)


class _SometimesUnsendable:
    """Pickles, except where it holds the image of sample index 7 (pixels encode their index)."""

    def __init__(self, image: torch.Tensor) -> None:
        self.index = decode_index(image)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.index == 7:
            raise TypeError("sample 7 does not pickle")
        return _SometimesUnsendable.__new__, (_SometimesUnsendable,)


@pytest.mark.timeout(120)
def test_a_batch_that_fails_to_pickle_past_the_first_is_an_error_not_a_hang(packed: Path) -> None:
    """The worker checks a transform's output type once; a later output that fails to pickle (or
    a tensor with no room in /dev/shm) failed in torch's queue thread, which prints it and drops
    the batch: the loop waited forever. The batch is pickled where it was built instead."""
    with (_loader(packed, num_workers=2, batch_size=4, transform=_SometimesUnsendable) as loader,
          pytest.raises(LoaderError, match=r"a batch \(4 samples, first '.*', last '.*'; sample '.*' gave what does "
                                           r"not pickle\) cannot be sent from its worker process to the training "
                                           r"process \(TypeError: sample 7 does not pickle\); return tensors, "
                                           "numbers") as info):
        list(loader)
    assert f"sample {info.value.where!r} gave what does not pickle" in info.value.message
    with _loader(packed, num_workers=0, batch_size=4, transform=_SometimesUnsendable) as here:
        index_of = {key: out.index for outputs, _, keys in here for key, out in zip(keys, outputs, strict=True)}
    assert index_of[info.value.where] == 7  # the sample named is the one whose output does not pickle


class _Nested(torch.utils.data.Dataset[int]):
    """A dataset of the user's own that iterates a loader inside each of its DataLoader's workers."""

    def __init__(self, ds: Path) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        loader = ShardLoader(str(self.ds), batch_size=8, transform=transforms.imagenet_val(16), num_workers=0)
        return sum(len(labels) for _, labels in loader)


def test_a_loader_iterated_in_a_worker_of_another_dataloader_yields_its_batches(packed: Path) -> None:
    """Only the workers of a loader's own DataLoader send their batches wrapped for the queue."""
    outer = torch.utils.data.DataLoader(_Nested(packed), batch_size=None, num_workers=1)
    assert list(outer) == [69]
