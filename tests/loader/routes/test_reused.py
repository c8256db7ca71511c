"""A device route's worker buffers reach the receiving process once: each travels as its file
descriptor with the first batch in it and as a key afterwards, and the receiving process keeps the
mapping for as long as the loader lives, dropping those of worker processes that have ended."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from multiprocessing import resource_sharer
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.routes import reused as reused_module
from shardkit.loader.routes.device.payload import BufferCycle, WorkerBuffers
from shardkit.loader.routes.gpu import GpuOptions
from shardkit.loader.routes.gpu.route import GpuRoute
from shardkit.loader.routes.gpu.worker import RawBatchBuilder
from shardkit.loader.routes.reused import received, reduce_reused, unship
from shardkit.loader.routes.segments import segment_view, shared_segment
from shardkit.loader.run.stream import BatchStream, raise_failures
from shardkit.loader.run.workers import shutdown_workers, worker_loader
from tests.loader.gpu_helpers import make_packed_imagenet_like, staged

pytestmark = pytest.mark.skipif(torch.multiprocessing.get_sharing_strategy() != "file_descriptor",
                                reason="buffers ship once under the file_descriptor strategy")

Batches = list[tuple[list[str], list[bytes], list[int]]]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("reused"))


@pytest.fixture
def descriptors_received(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the file descriptors this process receives from workers (multiprocessing's DupFd)."""
    count = [0]
    detach = resource_sharer.DupFd.detach

    def counted(self: Any) -> int:
        count[0] += 1
        return detach(self)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counted)
    yield count


def _epoch(source: Any) -> Batches:
    return [(list(b.keys), [bytes(t.numpy()) for t in staged(b).jpegs()], b.images.labels.tolist())
            for b in raise_failures(source)]


def _loader(dataset: Path) -> tuple[ShardLoader, transforms.ImageTransform]:
    transform = transforms.imagenet_train(64)
    return ShardLoader(str(dataset), batch_size=8, transform=transform, num_workers=0, shuffle=True), transform


def test_each_buffer_reaches_the_training_process_once_over_epochs(dataset: Path,
                                                                   descriptors_received: list[int]) -> None:
    loader, transform = _loader(dataset)
    control = torch.zeros(2, dtype=torch.int64).share_memory_()
    here = _epoch(BatchStream(loader.config, RawBatchBuilder(loader.reader, transform), control))
    builder = RawBatchBuilder(loader.reader, transform, buffer_cycle=3)
    source = worker_loader(BatchStream(loader.config, builder, control), num_workers=2, prefetch=1, pin_memory=False)
    epochs = [_epoch(source) for _ in range(3)]  # persistent workers: the same buffers, epoch after epoch
    shutdown_workers(source)
    assert epochs == [here] * 3 and len(here) * 3 > 2 * 3
    # 2 workers x 3 buffers (1 MiB each, room for every batch here): never one per batch
    assert 0 < descriptors_received[0] <= 2 * 3
    assert len(received(builder.buffers.token).segments) == descriptors_received[0]


def test_the_mappings_of_ended_workers_go_and_those_of_the_loader_with_it(dataset: Path,
                                                                         descriptors_received: list[int]) -> None:
    loader, transform = _loader(dataset)
    control = torch.zeros(2, dtype=torch.int64).share_memory_()
    builder = RawBatchBuilder(loader.reader, transform, buffer_cycle=3)
    stream = BatchStream(loader.config, builder, control)
    mapped_pids = []
    for _ in range(3):  # new worker processes each time, which ship their own buffers
        source = worker_loader(stream, num_workers=2, prefetch=1, pin_memory=False)
        _epoch(source)
        shutdown_workers(source)
        mapped_pids.append({key[1] for key in received(builder.buffers.token).segments})
    # each epoch's buffers came anew; once they did, none of an ended worker's stayed mapped
    assert descriptors_received[0] > 2 * 3 and all(len(pids) == 2 for pids in mapped_pids)
    assert len(set().union(*mapped_pids)) == 6
    token = builder.buffers.token
    del builder, stream, source
    assert len(received(token).segments) == 0  # the loader's copy held the mappings: none left


def test_a_buffer_whose_batch_did_not_pickle_carries_its_descriptor_again() -> None:
    buffers = WorkerBuffers(cycle=2)
    cycle = BufferCycle(2, buffers.token)
    blob = cycle.take(4096)
    blob[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)

    def shipped(sent: list[Any]) -> tuple[Any, ...]:
        reduced = reduce_reused(blob.untyped_storage(), sent)
        assert reduced is not None
        return reduced

    sent: list[Any] = []
    first = shipped(sent)
    assert first[1][2] is not None and len(sent) == 1
    assert shipped([])[1][2] is None  # shipped already: a key only
    unship(sent)  # that batch failed to pickle: it never arrived
    again = shipped([])
    assert again[1][2] is not None
    storage = again[0](*again[1])  # what the receiving process rebuilds, mapped here once more
    assert segment_view(storage, (4,)).tolist() == [1, 2, 3, 4]
    key_only = shipped([])
    assert key_only[0](*key_only[1]).data_ptr() == storage.data_ptr()  # the same mapping, not a new one
    assert reduce_reused(torch.empty(8, dtype=torch.uint8).untyped_storage(), []) is None


def test_a_key_without_its_buffer_is_a_loader_error() -> None:
    buffers = WorkerBuffers(cycle=2)
    blob = BufferCycle(2, buffers.token).take(4096)
    reduce_reused(blob.untyped_storage(), [])  # its descriptor went with a batch this process never received
    data = io.BytesIO()
    pickler = ForkingPickler(data)

    def reduce(storage: torch.UntypedStorage) -> Any:
        return reduce_reused(storage, [])

    pickler.dispatch_table[torch.UntypedStorage] = reduce
    pickler.dump(blob)
    with pytest.raises(LoaderError, match=r"sent a batch in its shared buffer \d+ before the buffer itself"):
        pickle.loads(data.getvalue())


def test_other_memory_where_a_dropped_buffer_was_ships_as_torch_ships_it() -> None:
    """A buffer dropped without being forgotten (its cycle garbage collected) leaves its entry; a
    tensor later placed at its address is not taken for it (the receiver would map the old buffer)."""
    buffers = WorkerBuffers(cycle=2)
    blob = BufferCycle(2, buffers.token).take(4096)
    reduce_reused(blob.untyped_storage(), [])
    address = blob.untyped_storage().data_ptr()
    other = shared_segment(4096)
    assert reduce_reused(other, []) is None  # not a reused segment at all
    stale = reused_module._REUSED[address]
    reused_module._REUSED[other.data_ptr()] = stale  # as if `other` had been mapped where the dropped one was
    assert reduce_reused(other, []) is None


def _round_trip(blob: torch.Tensor) -> torch.Tensor:
    """``blob`` pickled as a worker's Shipped pickles it and unpickled here, as the receiver does."""
    data = io.BytesIO()
    pickler = ForkingPickler(data)
    torch_reduce = pickler.dispatch_table[torch.UntypedStorage]

    def reduce(storage: torch.UntypedStorage) -> Any:
        return reduce_reused(storage, []) or torch_reduce(storage)

    pickler.dispatch_table[torch.UntypedStorage] = reduce
    pickler.dump(blob)
    return pickle.loads(data.getvalue())


def _child_sees(token: str, queue: Any) -> None:
    queue.put(len(received(token).segments))


def test_a_grown_buffer_replaces_its_mapping_and_a_forked_child_or_let_go_drops_them() -> None:
    """Before, every size a buffer grew through stayed mapped in the receiver, and workers forked
    later inherited the mappings of the ones before them."""
    buffers = WorkerBuffers(cycle=1)
    cycle = BufferCycle(1, buffers.token)
    small = cycle.take(16)
    small[:2] = torch.tensor([5, 6], dtype=torch.uint8)
    assert _round_trip(small)[:2].tolist() == [5, 6]
    big = cycle.take(4 << 20)  # beyond the first segment's 1 MiB: a bigger one replaces it
    big[:2] = torch.tensor([7, 8], dtype=torch.uint8)
    assert _round_trip(big)[:2].tolist() == [7, 8]
    mapped = received(buffers.token).segments
    assert len(mapped) == 1 and next(iter(mapped.values())).nbytes() == big.numel()
    context = torch.multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_sees, args=(buffers.token, queue))
    child.start()
    assert queue.get(timeout=60) == 0 and len(received(buffers.token).segments) == 1  # the child's copy only
    child.join(30)
    buffers.let_go()  # the workers stopped
    assert received(buffers.token).segments == {}


def test_the_gpu_route_lets_the_buffers_go_when_its_workers_stop_and_before_new_ones_start(dataset: Path) -> None:
    loader, transform = _loader(dataset)
    route = GpuRoute(loader.reader, transform, device=torch.device("cpu"), on_error="replace", batch_size=8,
                     num_workers=2, prefetch=2, options=GpuOptions())
    mapped = received(route.builder.buffers.token)
    for hook in (route.workers_stopped, route.before_workers):
        mapped.segments[(route.builder.buffers.token, 1, 0, 0)] = shared_segment(16)
        hook()
        assert mapped.segments == {}
