"""The batch stream one worker runs: this epoch's plan, this worker's batches, built in order.

A ``torch.utils.data.IterableDataset`` so torch's ``DataLoader`` can run it in persistent worker
processes. The epoch and resume point are read from a small shared-memory tensor at the start of
each iteration, which is how persistent workers learn about a new epoch.

*Read-ahead* (``read_ahead=True``): a worker does not stop at the end of the epoch but goes on
into the next ones, whole, so the workers (and the route's host pipeline behind them) prepare the
next epoch's first batches while the training loop finishes this one, instead of all of them
starting from empty when it asks. Each epoch is padded with :class:`EpochPadding` markers to a
whole number of rounds over the workers, so every epoch starts at worker 0 as a fresh start
would, and the batches, their order and their samples are those of epochs run one at a time.
:func:`raise_failures` drops the markers; whoever reads such a stream takes each epoch's
batches by count, as the loader does.

A :class:`~shardkit.errors.ShardkitError` raised in a worker process is shipped to the main
process as a :class:`WorkerFailure` record (torch would otherwise re-raise it as its type built
from the whole traceback text, losing ``where``); :func:`raise_failures` re-raises it there with
its type, message and ``where``, chained to the worker's traceback. So is an error a user's
transform raised on a sample (:mod:`~shardkit.loader.read.user_errors`), re-raised with its type,
its message and a note naming the sample, instead of torch's text of the whole traceback.

In a worker process each batch goes out wrapped in a :class:`Shipped`: the thread that feeds
torch's queue pickles it (overlapping the next batch's work, as before), but where the batch
fails to pickle (a transform's output that does not pickle, no room left for a tensor in
/dev/shm) it sends a :class:`WorkerFailure` naming the batch's samples in its place. That thread
only prints what it fails to pickle and drops it, and the training loop then waited for the
batch forever.
"""

from __future__ import annotations

import io
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Generic, NoReturn, TypeVar

import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardkit.errors import LoaderError, ShardkitError
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.plan import worker_batch_indices
from shardkit.loader.epochs.remainder import Remainder
from shardkit.loader.epochs.seeds import sample_seeds
from shardkit.loader.read.user_errors import picklable_kind, sample_of
from shardkit.loader.routes.batch import Builder, WorkerBatch
from shardkit.loader.routes.reused import reduce_reused, unship
from shardkit.loader.routes.segments import in_segment
from shardkit.loader.run.forks import freeze_forked_children
from shardkit.transforms import gpu_ahead

W = TypeVar("W", bound=WorkerBatch)


class WorkerTraceback(Exception):
    """The traceback of an error raised in a DataLoader worker, as text (the ``__cause__``)."""


@dataclass(frozen=True)
class WorkerFailure:
    """A :class:`ShardkitError` raised in a worker, or an error a transform raised on the sample
    ``where`` (any type that pickles by reference; else ``RuntimeError``), as picklable data."""

    kind: type[BaseException]
    message: str
    where: str
    traceback: str
    pickled: bytes = b""  # a transform's error, whole (its attributes and notes too), where it pickles
    notes: tuple[str, ...] = ()  # its notes (the one naming the sample among them), where it does not


@dataclass(frozen=True)
class EpochPadding:
    """Fills a read-ahead stream's epoch up to a whole round over the workers (see the module doc)."""


_SHIPS = False
"""This process is a worker of a loader's own DataLoader (:func:`ship_from_this_worker`)."""


def ship_from_this_worker() -> None:
    """Mark this process as a worker of a loader's own DataLoader (its ``worker_init_fn`` calls
    this): its batches go out as :class:`Shipped`. A loader iterated inside a worker of someone
    else's DataLoader reads its stream in that process and yields its batches as they are."""
    global _SHIPS
    _SHIPS = True


class Shipped:
    """A worker's batch on its way to the training process (see the module doc): it unpickles as
    the batch, or as a :class:`WorkerFailure` where the batch does not pickle, so the training
    process never sees this wrapper. Pickled as ``multiprocessing`` pickles for its queues
    (torch's reductions: tensors by descriptor), except that under the ``file_descriptor``
    strategy a tensor's memory not yet shared is copied into a nameless segment
    (:func:`~shardkit.loader.routes.segments.in_segment`: on Linux outside /dev/shm, whose size
    then bounds no batch) where torch would copy it into /dev/shm, and a buffer the worker refills
    batch after batch travels as its descriptor once, then as a key
    (:mod:`~shardkit.loader.routes.reused`)."""

    __slots__ = ("batch",)

    def __init__(self, batch: WorkerBatch) -> None:
        self.batch = batch

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        buffer = io.BytesIO()
        pickler = ForkingPickler(buffer)
        sent: list[Any] = []  # reused segments whose descriptors this batch carries
        if torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
            torch_reduce = pickler.dispatch_table[torch.UntypedStorage]  # this pickler's own copy of the table

            def reduce(storage: torch.UntypedStorage) -> Any:
                return reduce_reused(storage, sent) or torch_reduce(in_segment(storage))

            pickler.dispatch_table[torch.UntypedStorage] = reduce
        try:
            pickler.dump(self.batch)
        except Exception as err:  # pickling raises many types: TypeError, PicklingError, RuntimeError
            unship(sent)  # their descriptors never arrive: the next batches in them carry them
            unsent = getattr(getattr(self.batch, "slot", None), "unsent", None)
            if unsent is not None:  # a pool slot pickled before the failure never arrives: free it here
                unsent()
            return _same, (_failure(_unsendable(self.batch, err)),)  # with the pickling error's traceback
        return pickle.loads, (buffer.getvalue(),)


def _same(value: Any) -> Any:
    return value


def _unsendable(batch: WorkerBatch, err: Exception) -> LoaderError:
    """The error for a ``batch`` that did not pickle (``err``), naming the sample whose output
    does not pickle where it can be told (a batch of one output per sample), else its first."""
    keys, text = batch.keys, str(err)
    no_room = any(s in text for s in ("shared memory", "No space left", "Cannot allocate memory", "mmap"))
    culprit = None if no_room else _culprit(batch)
    samples = f"{len(keys)} samples, first {keys[0]!r}, last {keys[-1]!r}" if len(keys) > 1 else f"{keys!r}"
    if culprit is not None and len(keys) > 1:
        samples += f"; sample {keys[culprit]!r} gave what does not pickle"
    if no_room and "/torch_" in text and torch.multiprocessing.get_sharing_strategy() == "file_system":
        hint = ("torch.multiprocessing's sharing strategy is file_system, which ships tensors through /dev/shm: "
                "give it room (docker run --shm-size=…), or keep the default file_descriptor strategy")
    elif no_room:
        room = "/dev/shm" if "/torch_" in text else "memory"  # torch's named segments, or ours
        hint = (f"no {room} left for its tensors: fewer workers or a smaller batch_size, or more {room} "
                f"({'docker run --shm-size=…' if room == '/dev/shm' else 'docker run --memory=…'})")
    else:
        hint = "return tensors, numbers or other picklable objects from the transform, or use num_workers=0"
    where = keys[culprit] if culprit is not None else keys[0] if keys else ""
    return LoaderError(f"a batch ({samples}) cannot be sent from its worker process to the training process "
                       f"({type(err).__name__}: {err}); {hint}", where=where)


def _culprit(batch: WorkerBatch) -> int | None:
    """Where ``batch`` holds a list of one output per sample: the first that does not pickle, as
    the queue pickles (tensors' memory left out: nothing is copied or shared to find it)."""
    keys = batch.keys
    for value in getattr(batch, "__dict__", {}).values():
        if isinstance(value, list) and value is not keys and len(value) == len(keys) > 1:
            for i, item in enumerate(value):
                pickler = ForkingPickler(io.BytesIO())
                pickler.dispatch_table[torch.UntypedStorage] = lambda storage: (bytearray, ())
                try:
                    pickler.dump(item)
                except Exception:  # pickling raises many types
                    return i
    return None


def raise_failures(source: Iterable[W | WorkerFailure | EpochPadding],
                   started: Callable[[], None] | None = None) -> Iterator[W]:
    """Pass ``source``'s batches on, without the :class:`EpochPadding` of a read-ahead stream;
    re-raise a :class:`WorkerFailure` as its original error. ``started`` is called once
    ``iter(source)`` has returned (a DataLoader's worker processes are running then), before the
    first batch is waited for. ``iter`` may fork the workers: first a kernel compile still running
    in a thread of this process is waited for (:mod:`shardkit.transforms.gpu_ahead`), and the fork
    hooks of :func:`~shardkit.loader.run.forks.freeze_forked_children` are put in place."""
    gpu_ahead.wait_all()
    freeze_forked_children()
    items = iter(source)
    if started is not None:
        started()
    for item in items:
        if isinstance(item, Shipped):  # read in the worker's own process (never pickled)
            item = item.batch
        if isinstance(item, WorkerFailure):
            reraise(item)
        if not isinstance(item, EpochPadding):
            yield item


def reraise(failure: WorkerFailure) -> NoReturn:
    """Raise the error ``failure`` records, with its type, message and ``where``, chained to its traceback."""
    cause = WorkerTraceback(failure.traceback)
    if issubclass(failure.kind, ShardkitError):
        raise failure.kind(failure.message, where=failure.where) from cause
    err = _unpickled(failure.pickled)
    if err is None:
        try:
            err = failure.kind(failure.message)
        except Exception:  # a type whose constructor takes other arguments
            err = RuntimeError(f"{failure.kind.__qualname__}: {failure.message}")
        for note in failure.notes:
            err.add_note(note)
    raise err from cause


def _unpickled(data: bytes) -> BaseException | None:
    """The error pickled in ``data``, or None (none, or one this process cannot rebuild)."""
    if not data:
        return None
    try:
        err = pickle.loads(data)
    except Exception:  # its type is not importable here, or its constructor differs from its args
        return None
    return err if isinstance(err, BaseException) else None


def _failure(err: BaseException, sample: str | None = None) -> WorkerFailure:
    """``err``, raised in a worker process (by a transform on ``sample``), as a :class:`WorkerFailure`."""
    if isinstance(err, ShardkitError):
        return WorkerFailure(type(err), err.message, err.where, traceback.format_exc())
    kind = picklable_kind(err)
    message = str(err) if kind is not None else f"{type(err).__qualname__}: {err}"
    pickled = b""
    if kind is not None:
        try:
            pickled = pickle.dumps(err)  # its __reduce__ leaves the traceback out
            pickle.loads(pickled)  # rebuilt here, it will be in the training process too
        except Exception:  # attributes that do not pickle, a constructor unlike its args: type and message travel
            pickled = b""
    notes = tuple(str(n) for n in getattr(err, "__notes__", ()))
    return WorkerFailure(kind or RuntimeError, message, sample or "", traceback.format_exc(), pickled, notes)


class BatchStream(IterableDataset[W | WorkerFailure | EpochPadding], Generic[W]):
    """Yield this worker's batches of the epoch in ``control = [epoch, start_batch]`` (and with
    ``read_ahead``, of every later epoch, whole: see the module doc); in a worker process, a
    :class:`ShardkitError` ends the stream as a :class:`WorkerFailure`.

    ``builder``: the route's worker half (:class:`~shardkit.loader.routes.base.Builder`). ``remainder``:
    ``(epoch, Remainder)`` after an elastic resume, that epoch runs on what the remainder leaves
    (set before the workers start: they hold a copy).

    ``layout``: ``(part, parts, workers)`` when this stream's workers are one part of a larger
    set (:mod:`~shardkit.loader.feed.pool`: ``parts`` processes share ``workers`` workers): its
    worker ``i`` is worker ``part + parts * i`` of ``workers``. None: its workers are all.
    """

    def __init__(self, config: PlanConfig, builder: Builder[W], control: torch.Tensor,
                 layout: tuple[int, int, int] | None = None, read_ahead: bool = False) -> None:
        self.config = config
        self.builder = builder
        self.control = control
        self.layout = layout
        self.read_ahead = read_ahead
        self.remainder: tuple[int, Remainder] | None = None

    def remainder_for(self, epoch: int, rest: Remainder | None) -> tuple[bool, tuple[int, Remainder] | None]:
        """Whether :attr:`remainder` must change (restarting the workers, which hold a copy) for
        ``epoch`` to run on ``rest`` (what an elastic resume left of it; None: all of it), and
        its new value. A remainder held for another epoch is left: it applies to that epoch only.

        Example:
            >>> s = BatchStream(None, None, None)  # type: ignore[arg-type]
            >>> s.remainder_for(0, None)
            (False, None)
        """
        if rest is not None:
            return self.remainder != (epoch, rest), (epoch, rest)
        return self.remainder is not None and self.remainder[0] == epoch, None

    def __iter__(self) -> Iterator[W | WorkerFailure | EpochPadding]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.layout is not None:
            part, parts, workers = self.layout
            worker = part + parts * worker
        epoch, start = int(self.control[0]), int(self.control[1])
        cfg = self.config
        while True:
            rest = self.remainder[1] if self.remainder is not None and self.remainder[0] == epoch else None
            count = cfg.epoch_batches(rest)
            mine = worker_batch_indices(count, num_workers=workers, worker_id=worker, start_batch=start)
            order = cfg.order(epoch)
            for j in mine:
                shards, indices, positions = cfg.batch(order, j, rest)
                seeds = sample_seeds(cfg.seed, epoch, positions)
                try:
                    batch = self.builder.build(shards.tolist(), indices.tolist(), seeds.tolist())
                except Exception as err:
                    sample = sample_of(err)
                    if info is None or not (isinstance(err, ShardkitError) or sample):
                        raise  # in this process the error keeps its own traceback; torch wraps others
                    yield _failure(err, sample)
                    return
                yield Shipped(batch) if _SHIPS else batch  # type: ignore[misc]  # unpickles as the batch
            if not self.read_ahead or cfg.epoch_batches(None) == 0:
                return
            rounds = -(-(count - start) // workers)  # this epoch's rounds over the workers
            for _ in range(rounds - len(mine)):
                yield EpochPadding()
            epoch, start = epoch + 1, 0
