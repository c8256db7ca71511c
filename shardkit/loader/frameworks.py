"""What training frameworks read off a loader besides its batches, and the answers ShardLoader gives.

- accelerate's ``Accelerator.accumulate`` steps the optimizer at the last batch of an epoch when
  the ``GradientState``'s active dataloader says ``end_of_dataloader``; its own ``DataLoaderShard``
  registers itself for that while it is iterated. :func:`seen_by_accelerate` does the same for a
  ``ShardLoader`` (only where the training script made an ``Accelerator``; shardkit never imports
  accelerate), so the last micro-batches of an epoch do not roll into the next one.
- ``skip_first_batches`` (accelerate) and ``DataLoader``/``StatefulDataLoader`` wrapping expect a
  dataset inside the loader; a ShardLoader has none, and its own :meth:`state_dict` does their
  job. :data:`NO_DATASET` and :data:`NOT_A_DATASET` say so in one line (the first also where the
  sample count is, which ``len(loader.dataset)`` gives a DataLoader).
- With ``even_batches=False`` ranks may get one batch fewer than others, and a DDP training
  step (its gradient all-reduce), accelerate's ``gather_for_metrics`` or any collective called
  per batch then waits on a rank that has none left (gloo fails, NCCL hangs): :func:`say_if_uneven`
  says so once per loader where the ranks' counts differ, as it starts iterating with autograd
  on (a training loop; an evaluation loop runs under ``torch.no_grad()`` and gathers once after
  it), and where accelerate reads ``end_of_dataloader`` during an iteration (its
  ``gather_for_metrics`` does after each batch's gather, under ``no_grad`` too).
- Lightning's loops give each epoch's number to ``loader.sampler.set_epoch`` before they iterate
  (as to a ``DistributedSampler``; DDP scripts call it by hand too), and nothing else: a fit
  resumed from a checkpoint taken at an epoch's end loads no loader state. :class:`EpochSampler`,
  a ShardLoader's ``sampler``, passes the number on, so such a resume runs the next epoch, not
  the loader's own first one again; :class:`EpochBatches` is its ``batch_sampler``.
- An ``Accelerator`` that runs its process alone while the launcher started several (a plain
  ``Accelerator()`` under ``torchrun`` on a machine without a GPU) trains a model per process,
  each on the share of the data the launcher's variables give it: :func:`check_accelerate_world`
  refuses that in one line instead.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from torch.utils.data import SequentialSampler

from shardkit import _compat
from shardkit.errors import LoaderError

log = logging.getLogger("shardkit.loader")

__all__ = ["NOT_A_DATASET", "NO_DATASET", "EpochBatches", "EpochSampler", "InOrderEpochs", "check_accelerate_world",
           "epoch_sampler", "say_if_uneven", "seen_by_accelerate"]

#: Why ``loader.dataset`` fails (what ``skip_first_batches`` reads first, and ``len(loader.dataset)``
#: counts with a DataLoader).
NO_DATASET = ("ShardLoader has no .dataset (skip_first_batches cannot skip in it): its samples are counted by "
              "loader.manifest.num_samples, its batches by len(loader), and it resumes mid-epoch with "
              "loader.load_state_dict(state), state from loader.state_dict()")

#: Why ``loader[i]`` fails (what a ``DataLoader`` or ``StatefulDataLoader`` wrapped around it does).
NOT_A_DATASET = ("ShardLoader is a loader, not a dataset: iterate it directly instead of wrapping it in "
                 "DataLoader or StatefulDataLoader (it splits the epoch over ranks and workers itself, and "
                 "state_dict()/load_state_dict() resume it mid-epoch)")


class EpochSampler:
    """``loader.sampler``: what a ``DataLoader``'s sampler is asked for when its loader is a
    ShardLoader, which draws its samples itself. ``set_epoch(epoch)`` makes the loader's next
    iteration run ``epoch`` from its start, as a ``DistributedSampler``'s makes its next
    ``iter()`` (Lightning's loops call it before each epoch's iteration, DDP scripts by hand; see
    :meth:`~shardkit.ShardLoader.set_epoch` for a resume point it keeps); ``len()`` counts the
    samples this rank yields in an epoch, padding included, as a ``DistributedSampler`` counts its
    own; :attr:`epoch` is the loader's. It yields no indices.
    """

    def __init__(self, loader: Any) -> None:
        # weakly: the loader keeps its sampler, and a loader dropped without close() must stop its
        # workers at once, not when the cycle collector comes by
        self._ref = weakref.ref(loader)

    @property
    def _loader(self) -> Any:
        loader = self._ref()
        if loader is None:
            raise ReferenceError("the ShardLoader of this sampler is gone")
        return loader

    def set_epoch(self, epoch: int) -> None:
        """Make the loader's next iteration run ``epoch``."""
        self._loader._set_epoch(epoch, by_sampler=True)

    @property
    def epoch(self) -> int:
        """The loader's :attr:`~shardkit.ShardLoader.epoch`."""
        return int(self._loader.epoch)

    def __len__(self) -> int:
        len(self._loader)  # the rank and world as they are now (a loader built before the process group)
        return int(self._loader.config.rank_samples)

    def __iter__(self) -> Iterator[int]:
        raise TypeError("a ShardLoader's sampler yields no indices: the loader reads its shards in the epoch's "
                        "order itself; iterate the loader, and give it the epoch with loader.set_epoch(epoch) "
                        "(or loader.sampler.set_epoch(epoch))")

    def __repr__(self) -> str:  # no layout taken here: a repr must not raise (a world not settled yet)
        loader = self._ref()
        if loader is None:
            return f"{type(self).__name__}(its loader gone)"
        return f"{type(self).__name__}(epoch={loader.epoch}, samples={loader.config.rank_samples})"


class InOrderEpochs(EpochSampler, SequentialSampler):
    """The :class:`EpochSampler` of a loader made with ``shuffle=False``: a ``SequentialSampler``
    to ``isinstance`` (Lightning's ``overfit_batches`` warns of any other that it turns shuffling
    off), and an :class:`EpochSampler` in everything else."""


def epoch_sampler(loader: Any) -> EpochSampler:
    """The sampler ``loader`` shows (:class:`InOrderEpochs` where it does not shuffle)."""
    return EpochSampler(loader) if loader.config.shuffle else InOrderEpochs(loader)


class EpochBatches:
    """``loader.batch_sampler``: what a ``DataLoader``'s batch sampler is asked for (Lightning's
    DeepSpeed strategy reads its ``batch_size``; Lightning looks for a ``sampler`` behind it):
    the loader's ``batch_size``, ``drop_last`` and :class:`EpochSampler`; ``len()`` counts the
    loader's batches. It yields no batches of indices."""

    def __init__(self, sampler: EpochSampler, batch_size: int, drop_last: bool) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __len__(self) -> int:
        return len(self.sampler._loader)

    def __iter__(self) -> Iterator[list[int]]:
        raise TypeError("a ShardLoader's batch_sampler yields no indices: the loader makes its batches itself; "
                        "iterate the loader")


@contextmanager
def seen_by_accelerate(loader: Any) -> Generator[None, None, None]:
    """While the block runs, ``loader`` is the active dataloader of accelerate's ``GradientState``
    (where an ``Accelerator`` exists in this process; otherwise nothing happens).

    ``loader`` must carry ``end_of_dataloader`` (True while its epoch's last batch is out) and
    ``remainder`` (0: nothing for ``gather_for_metrics`` to cut, padding is dropped per batch with
    ``real_samples``), the two attributes accelerate reads.
    """
    state = _compat.accelerate_gradient_state()
    if state is None:
        yield
        return
    _compat.accelerate_track(state, loader)
    # bound now: an iterator still open at interpreter exit is closed after modules are torn down
    untrack, finalizing = _compat.accelerate_untrack, sys.is_finalizing
    try:
        yield
    finally:
        if not finalizing():  # at exit there is no epoch left to end, and accelerate is half gone
            untrack(state, loader)


def check_accelerate_world(rank: int, world_size: int) -> None:
    """Refuse a loader that found itself ``rank`` of ``world_size`` (from the process group or the
    launcher's variables) in a process whose ``Accelerator`` runs it alone: each process would
    train a model of its own on part of the data, with no gradient shared and no word said. (A
    plain ``Accelerator()`` under ``torchrun`` without a GPU makes a gloo group of the launcher's
    processes and still counts one.)

    Raises:
        LoaderError: an ``Accelerator`` in this process counts 1 process, ``world_size > 1``.
    """
    if world_size > 1 and _compat.accelerate_processes() == 1:
        raise LoaderError(f"this process is rank {rank} of {world_size}, but accelerate runs it alone "
                          "(Accelerator().num_processes is 1): each process would train its own model on part of the "
                          "data, no gradient shared. On the CPU build Accelerator(cpu=True) (or launch with "
                          "`accelerate launch --cpu`); to lay the loader out anyway pass rank= and world_size= "
                          "(rank=0, world_size=1: all the data in each process)")


#: Loaders told that their ranks' batch counts differ (once each).
_told_uneven: weakref.WeakSet[Any] = weakref.WeakSet()


def say_if_uneven(loader: Any) -> None:
    """Warn, once per loader, where ``even_batches=False`` gives its ranks different batch counts:
    a DDP training step, a ``gather_for_metrics`` or any collective per batch waits on a rank that
    has none left."""
    config = getattr(loader, "config", None)
    if config is None or config.even_batches or config.world_size < 2 or loader in _told_uneven:
        return
    counts = {replace(config, rank=rank).num_batches for rank in (0, config.world_size - 1)}
    if len(counts) > 1:
        _told_uneven.add(loader)
        log.warning("shardkit: with even_batches=False the ranks get %d or %d batches an epoch (this one %d): if "
                    "this loop trains, a DDP step, a gather_for_metrics or any collective per batch waits forever "
                    "on a rank with none left (train with even_batches=True, or under DDP's join()); an "
                    "evaluation loop counts per rank and gathers once after it, under torch.no_grad(), which "
                    "also keeps this quiet (docs: evaluation)", min(counts), max(counts), config.num_batches)
