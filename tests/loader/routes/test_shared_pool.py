"""SharedBatchPool (the CPU route's): worker batches handed to the main process in reused shared memory, never
overwritten while anything still references them."""

from __future__ import annotations

import io
import pickle
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.routes.cpu import CpuRoute
from shardkit.loader.routes.cpu import worker as batch_module
from shardkit.loader.routes.cpu.shared_pool import SharedBatchPool
from shardkit.loader.routes.cpu.worker import CpuBatch, CpuBatchBuilder
from shardkit.loader.stats import StageStats


def _pool(loader: ShardLoader) -> SharedBatchPool | None:
    """The shared batch pool of a loader on the CPU route."""
    assert isinstance(loader.route, CpuRoute)
    return loader.route.pool


def _ship(obj: object) -> bytes:
    """Pickle as a DataLoader worker does (torch's reductions share storages by descriptor)."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return buf.getvalue()


def test_slot_is_busy_until_the_last_view_is_gone() -> None:
    pool = SharedBatchPool(num_workers=2, slots_per_worker=2, shape=(4, 3, 5, 5))
    got = pool.acquire(1, 3)
    assert got is not None
    out, ref = got
    out.copy_(torch.arange(3 * 75, dtype=torch.uint8).view(3, 3, 5, 5))
    images = pickle.loads(_ship(ref))
    assert images.shape == (3, 3, 5, 5) and torch.equal(images, out)
    assert pool.busy.tolist() == [0, 0, 1, 0]
    view = images[1:].permute(0, 2, 3, 1)
    del images
    pool.collect()
    assert pool.busy.tolist() == [0, 0, 1, 0]  # the view still reads the slot
    del view
    assert pool.busy.tolist() == [0, 0, 1, 0]  # free from the next collect (the next batch taken)
    pool.collect()
    assert pool.busy.tolist() == [0, 0, 0, 0]


def test_no_python_runs_where_a_batch_dies() -> None:
    """A Ctrl-C landing in Python code that runs where the consumer drops a batch (a finaliser)
    is lost: Python reports it and goes on. Dropping a delivered batch runs none."""
    import gc
    import sys

    pool = SharedBatchPool(num_workers=1, slots_per_worker=2, shape=(2, 3, 4, 4))
    got = pool.acquire(0, 2)
    assert got is not None
    images = pickle.loads(_ship(got[1]))
    calls: list[str] = []
    gc.disable()  # a collection here could run other objects' finalisers
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
    try:
        del images
    finally:
        sys.setprofile(None)
        gc.enable()
    assert calls == [] and len(pool._dead) == 1
    pool.collect()
    assert pool.busy.tolist() == [0, 0]


def test_full_pool_says_so_and_segments_travel_once() -> None:
    pool = SharedBatchPool(num_workers=1, slots_per_worker=2, shape=(2, 3, 64, 64))
    first = pool.acquire(0, 2)
    second = pool.acquire(0, 2)
    assert first is not None and second is not None
    assert pool.acquire(0, 1) is None  # both slots busy: the caller allocates instead
    a = pickle.loads(_ship(first[1]))
    del a
    pool.collect()  # slot 0 free again
    again = pool.acquire(0, 1)
    assert again is not None
    again[0].fill_(9)
    msg = _ship(again[1])
    assert len(msg) < 1000  # a reference, not 12 KB of pixels nor a new segment
    b = pickle.loads(msg)
    assert b.shape == (1, 3, 64, 64) and int(b.min()) == 9


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        SharedBatchPool(num_workers=0, slots_per_worker=2, shape=(2, 3, 4, 4))
    pool = SharedBatchPool(num_workers=1, slots_per_worker=1, shape=(2, 3, 4, 4))
    with pytest.raises(ValueError, match="does not fit"):
        pool.acquire(0, 3)


def test_batch_labels_travel_inline() -> None:
    batch = CpuBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([3, 7]), ["a", "b"], StageStats())
    back = pickle.loads(_ship(batch))
    assert back.labels.dtype == torch.int64 and back.labels.tolist() == [3, 7]
    assert back.keys == ["a", "b"]


def test_batches_kept_alive_are_never_overwritten(packed: Path) -> None:
    """Holding every batch of two epochs (no copies) exhausts the pool: workers fall back to
    fresh buffers and nothing held is reused; releasing them makes the pool serve again. Without
    read-ahead: with it the workers rightly take slots for the next epoch as soon as one ends, so
    'every slot free once the batches are released' would depend on timing."""
    def loader(workers: int) -> ShardLoader:
        return ShardLoader(str(packed), batch_size=8, transform=transforms.imagenet_train(32),
                           num_workers=workers, keys=True, read_ahead=False)

    plain = loader(0)
    reference = [(x.clone(), y.clone()) for _ in range(3) for x, y, _k in plain]
    with loader(2) as ld:
        held = [(x, y) for _ in range(2) for x, y, _k in ld]
        assert len(held) == 2 * len(ld)
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(held, reference, strict=False))
        pool = _pool(ld)
        assert pool is not None and int(pool.busy.sum()) > 0
        del held
        pool.collect()  # what taking the next batch does
        assert int(pool.busy.sum()) == 0
        again = [(x.clone(), y.clone()) for x, y, _k in ld]  # epoch 2 again served from the pool
        assert len({x.untyped_storage().data_ptr() for x, _y, _k in ld}) <= pool.busy.numel()
    third = reference[-len(again):]
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(again, third, strict=True))


def _train_loader(packed: Path, workers: int) -> ShardLoader:
    return ShardLoader(str(packed), batch_size=8, transform=transforms.imagenet_train(32), num_workers=workers)


def test_close_mid_epoch_gives_back_the_slots_of_batches_in_flight(packed: Path) -> None:
    """torch drops the batches in flight unread when it stops workers: their slots must not
    stay busy, or the pool stops serving after a few close() / re-iterate cycles."""
    reference = [(x.clone(), y.clone()) for x, y in _train_loader(packed, 0)]
    with _train_loader(packed, 2) as ld:
        pool = _pool(ld)
        assert pool is not None
        for _ in range(3):
            it = iter(ld)
            kept = next(it)  # a delivered batch still held: its slot must stay busy
            time.sleep(0.5)  # the workers fill their prefetch slots meanwhile
            del it
            ld.close()
            assert int(pool.busy.sum()) == 1
            del kept
            pool.collect()
            assert int(pool.busy.sum()) == 0
        ld.set_epoch(0)
        got = [(x.clone(), y.clone()) for x, y in ld]
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, reference, strict=True))


def test_failed_build_gives_its_slot_back(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = SharedBatchPool(num_workers=1, slots_per_worker=2, shape=(4, 3, 32, 32))
    ld = _train_loader(packed, 0)
    builder = CpuBatchBuilder(ld.reader, ld.transform, on_error="raise", pool=pool)
    monkeypatch.setattr(batch_module, "get_worker_info", lambda: SimpleNamespace(id=0))  # as worker 0

    def bad(*_args: object) -> None:
        raise BadSample("simulated corrupt sample")

    monkeypatch.setattr(builder, "_one", bad)
    for _ in range(3):
        with pytest.raises(LoaderError, match="simulated"):
            builder.build([0] * 4, [0, 1, 2, 3], [1, 2, 3, 4])
    assert pool.busy.tolist() == [0, 0]


def test_a_copied_loader_gets_a_pool_of_its_own(packed: Path) -> None:
    """A pickled loader (e.g. handed to mp.spawn) must not share slot flags with the original."""
    original = _train_loader(packed, 2)
    copy = pickle.loads(pickle.dumps(original))
    reference = [(x.clone(), y.clone()) for x, y in _train_loader(packed, 0)]
    with copy:
        got = [(x.clone(), y.clone()) for x, y in copy]
        pool, first = _pool(copy), _pool(original)
        assert pool is not None and first is not None
        assert pool.owned() and pool.busy.data_ptr() != first.busy.data_ptr()
        assert pool._received  # its batches came through its own slots
    assert int(pool.busy.sum()) == 0  # and went back (those read ahead into the next epoch on close)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, reference, strict=True))
    original.close()


def test_the_pool_serves_again_after_every_slot_was_held(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer holding as many batches as there are slots makes the workers allocate; once it
    drops them, later batches come through the slots again, though those batches themselves came
    in fresh segments (taking any batch frees the slots of dropped ones)."""
    import shardkit.loader.routes.cpu.shared_pool as shared_pool

    through = {"slot": 0, "own": 0}
    slot, own = shared_pool._receive, shared_pool._receive_own

    def in_slot(*args: object) -> torch.Tensor:
        through["slot"] += 1
        return slot(*args)  # type: ignore[arg-type]

    def in_own(*args: object) -> torch.Tensor:
        through["own"] += 1
        return own(*args)  # type: ignore[arg-type]

    with ShardLoader(str(packed), batch_size=4, transform=transforms.imagenet_train(32), num_workers=1,
                     prefetch=2) as ld:
        batches = iter(ld)
        held = [next(batches)]  # the worker runs (forked before the counting below: it pickles by name)
        monkeypatch.setattr(shared_pool, "_receive", in_slot)
        monkeypatch.setattr(shared_pool, "_receive_own", in_own)
        held += [next(batches) for _ in range(7)]  # more than the worker's 5 slots
        assert through["own"] > 0  # all slots held: the worker allocated
        del held
        through.update(slot=0, own=0)
        rest = sum(1 for _ in batches)
    assert rest > 5 and through["slot"] >= rest - 3, through


class _Unpicklable:
    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("no")


def test_a_batch_that_fails_to_pickle_after_its_slot_frees_the_slot() -> None:
    """The slot's segment was pickled before a later part of the batch failed: the main process
    never gets it, so the worker frees the slot and sends its segment with its next batch."""
    from shardkit.loader.run.stream import Shipped, WorkerFailure

    pool = SharedBatchPool(num_workers=1, slots_per_worker=1, shape=(2, 3, 4, 4))
    got = pool.acquire(0, 2)
    assert got is not None
    images, slot = got
    batch = CpuBatch(images, _Unpicklable(), ["a", "b"], StageStats(), slot)
    failure = pickle.loads(_ship(Shipped(batch)))
    assert isinstance(failure, WorkerFailure) and "cannot be sent" in failure.message
    assert pool.busy[slot.slot] == 0 and slot.slot not in pool._shipped
    assert pool.acquire(0, 2) is not None  # the worker has its slot again
