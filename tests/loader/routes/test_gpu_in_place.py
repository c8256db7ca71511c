"""The GPU route's worker reads each sample straight into the batch's shared buffer and leaves its
JPEG there: the bytes it ships are the shard's, wherever they lie; a sample it cannot leave there
(decoded on the CPU, bad, cut, beyond the planned room) gives its room back or is copied in after;
the staging slot hands nvJPEG the same bytes whatever the layout."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from shardkit import transforms
from shardkit.format.tarread import iter_entries
from shardkit.index.manifest_io import read_manifest
from shardkit.loader.read.reader import CorruptSample, ShardReader
from shardkit.loader.routes.device.payload import BatchArena, RawImages, WorkerBuffers
from shardkit.loader.routes.gpu.worker import RawBatchBuilder
from shardkit.storage import Store
from shardkit.transforms.gpu import GEOMETRY_COLUMNS
from tests.loader.gpu_helpers import make_packed_imagenet_like, staged

IMAGE_EXTS = ("jpg", "jpeg", "png")


@pytest.fixture(scope="module")
def inet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("inet"))


def _reader(ds: Path) -> ShardReader:
    store = Store(str(ds))
    return ShardReader(store, read_manifest(store).shards)


def _image(reader: ShardReader, shard: int, index: int) -> bytes:
    return next(data for ext, data in reader.read(shard, index)[1].items() if ext in IMAGE_EXTS)


def _pairs(reader: ShardReader) -> list[tuple[int, int]]:
    return [(s, i) for s in range(len(reader.shards)) for i in range(int(reader.shards.num_samples[s]))]


def _staged(raw: RawImages) -> list[bytes]:
    class _Batch:
        images = raw

    return [bytes(t.numpy()) for t in staged(_Batch()).jpegs()]  # type: ignore[arg-type]


def _damaged(inet: Path, tmp_path: Path, index: int) -> tuple[ShardReader, str]:
    """A reader of a copy of ``inet`` whose first shard has a flipped byte in sample ``index``'s
    image (its CRC-32 then mismatches), and that shard's URL."""
    ds = tmp_path / "ds"
    shutil.copytree(inet, ds)
    reader = _reader(ds)
    url = reader.shards.urls[0]
    entries = list(iter_entries(io.BytesIO((ds / url).read_bytes()), where="x", read_data=False))
    image = next(e for e in entries if e.name.startswith(reader.key(0, index) + ".") and not e.name.endswith(".cls"))
    data = bytearray((ds / url).read_bytes())
    data[image.data_offset + 40] ^= 0xFF
    (ds / url).write_bytes(bytes(data))
    return reader, url


def test_read_into_gives_what_read_gives_and_leaves_the_image_in_place(inet: Path) -> None:
    reader = _reader(inet)
    for shard, index in _pairs(reader)[:40]:
        key, fields = reader.read(shard, index)
        room = memoryview(bytearray(reader.span_size(shard, index)))
        got_key, small, placed = reader.read_into(shard, index, room)
        assert got_key == key and set(placed) | set(small) == set(fields) and len(placed) == 1
        assert {**small, **{ext: bytes(room[s:s + n]) for ext, (s, n) in placed.items()}} == fields
    with pytest.raises(ValueError, match="needs"):
        reader.read_into(0, 0, memoryview(bytearray(reader.span_size(0, 0) + 1)))
    reader.close()


def test_read_sample_gives_what_read_and_read_into_give_with_its_place_and_labels(inet: Path) -> None:
    reader = _reader(inet)
    asked: list[int] = []

    def reserve(size: int) -> tuple[int, memoryview]:
        asked.append(size)
        return 7, memoryview(bytearray(size))

    for shard, index in _pairs(reader)[:40]:
        into = reader.read_into(shard, index, memoryview(bytearray(reader.span_size(shard, index))))
        key, fields, placed, room, where, labels = reader.read_sample(shard, index, reserve)
        assert (key, fields, placed) == into and room is not None and room[0] == 7
        assert asked[-1] == len(room[1]) == reader.span_size(shard, index)
        assert {**fields, **{ext: bytes(room[1][s:s + n]) for ext, (s, n) in placed.items()}} == reader.read(
            shard, index)[1]
        assert where == reader.where(shard) and labels == reader.labels_of(shard)
        whole: tuple[object, ...] = (*reader.read(shard, index), {}, None, where, labels)
        assert reader.read_sample(shard, index, lambda _size: None) == reader.read_sample(shard, index) == whole
    reader.close()


def test_read_into_names_a_damaged_sample(inet: Path, tmp_path: Path) -> None:
    reader, url = _damaged(inet, tmp_path, 2)
    with pytest.raises(CorruptSample, match="checksum mismatch") as err:
        reader.read_into(0, 2, memoryview(bytearray(reader.span_size(0, 2))))
    assert err.value.where.endswith(f"{url}:{reader.key(0, 2)}")
    reader.close()


def test_the_worker_ships_the_shards_jpegs_from_where_it_read_them(inet: Path) -> None:
    reader = _reader(inet)
    builder = RawBatchBuilder(reader, transforms.imagenet_train(32), gray=True)
    pairs = _pairs(reader)[:16]
    raw = builder.build([s for s, _ in pairs], [i for _, i in pairs], list(range(16))).images
    spans = raw.spans.numpy()
    dests = raw.geometry[:, -1].tolist()
    want = [_image(reader, *pairs[d]) for d in dests]
    assert [bytes(t.numpy()) for t in raw.jpegs()] == want
    assert _staged(raw) == want
    assert spans[0, 0] >= 512 and np.all(spans[1:, 0] > spans[:-1, 1])  # after tar headers, not end to end
    assert raw.nbytes < sum(reader.span_size(*p) for p in pairs)  # (the CPU-decoded samples gave their room back)
    reader.close()


def test_a_replaced_sample_shares_its_replacements_jpeg(inet: Path, tmp_path: Path) -> None:
    reader, _ = _damaged(inet, tmp_path, 1)
    builder = RawBatchBuilder(reader, transforms.imagenet_train(32), gray=True)
    pairs = [(0, i) for i in range(8)]
    batch = builder.build([s for s, _ in pairs], [i for _, i in pairs], list(range(8)))
    raw = batch.images
    assert batch.stats.replaced == 1 and batch.keys[1] == batch.keys[2]
    dests = raw.geometry[:, -1].tolist()
    rows = {dest: row for row, dest in enumerate(dests)}
    assert raw.spans[rows[1]].tolist() == raw.spans[rows[2]].tolist()  # one copy of the bytes, two rows
    want = [_image(reader, 0, 2 if d == 1 else d) for d in dests]
    assert [bytes(t.numpy()) for t in raw.jpegs()] == want
    assert _staged(raw) == want  # out of order: the slot takes each span apart
    reader.close()


def test_the_arena_copies_in_what_it_has_no_room_for_and_grows() -> None:
    arena = BatchArena(WorkerBuffers(0), capacity=100)
    start, room = arena.reserve(60)  # type: ignore[misc]
    room[:] = bytes(range(60))
    arena.keep(start + 50)  # the JPEG: bytes 10..50 of the span
    assert arena.reserve(60) is None  # beyond the plan
    big = bytes(range(200, 255)) * 40
    raw = arena.lay_out([(0, (10, 50), (1,) * (len(GEOMETRY_COLUMNS) - 1)),
                         (1, big, (2,) * (len(GEOMETRY_COLUMNS) - 1))],
                        [], np.array([7, 8]), (4, 4))
    assert raw.spans.tolist() == [[10, 50], [50, 50 + len(big)]]
    assert [bytes(t.numpy()) for t in raw.jpegs()] == [bytes(range(10, 50)), big]
    assert raw.labels.tolist() == [7, 8] and raw.geometry[:, -1].tolist() == [0, 1]
    assert _staged(raw) == [bytes(range(10, 50)), big]


def test_an_arena_of_no_room_lays_jpegs_end_to_end() -> None:
    win = (0,) * (len(GEOMETRY_COLUMNS) - 1)
    raw = BatchArena(WorkerBuffers(0), 0).lay_out([(1, b"abc", win), (0, b"", win), (2, b"defg", win)],
                                                  [(3, torch.full((3, 2, 2), 9, dtype=torch.uint8))],
                                                  np.array([0, 1, 2, 3]), (2, 2))
    assert raw.spans.tolist() == [[0, 3], [3, 3], [3, 7]]
    assert [bytes(t.numpy()) for t in raw.jpegs()] == [b"abc", b"", b"defg"]
    assert _staged(raw) == [b"abc", b"", b"defg"]
    assert raw.cpu_dest.tolist() == [3] and raw.cpu_images.eq(9).all() and raw.geometry[:, -1].tolist() == [1, 0, 2]


def test_a_jpeg_the_device_rejects_is_decoded_from_the_slots_copy(inet: Path) -> None:
    """By the time the host rescues a JPEG nvJPEG refused, the worker may be writing a later batch
    into the shared buffer this one came in: the rescue reads the staging slot's copy."""
    from shardkit.loader.routes.gpu.host import GpuPipeline

    reader = _reader(inet)
    t = transforms.imagenet_val(32)
    pairs = _pairs(reader)[:8]
    batch = RawBatchBuilder(reader, t, gray=True).build([s for s, _ in pairs], [i for _, i in pairs], list(range(8)))
    pipeline = GpuPipeline(t, torch.device("cpu"), compile=False)
    slot = staged(batch)
    decoded, rejected = pipeline.decode(batch, slot)
    assert rejected == [] and len(decoded) >= 2
    before = pipeline.augment(batch, slot, decoded[1:], [0])
    batch.images.blob.fill_(0)  # the worker's next batch, in the same buffer
    after = pipeline.augment(batch, slot, decoded[1:], [0])
    assert before.stats.replaced == after.stats.replaced == 0
    assert torch.equal(after.images, before.images) and after.images.float().std() > 10
    reader.close()


def test_a_sample_read_in_place_still_names_all_its_members(inet: Path) -> None:
    from shardkit.loader.read.samples import SampleSource
    from shardkit.loader.stats import StageStats

    reader = _reader(inet)
    arena = BatchArena(WorkerBuffers(0), reader.span_size(0, 0))
    sample = SampleSource(reader).read(0, 0, StageStats(), arena)
    assert sample.image_view is not None and sample.image_ext not in sample.fields  # left in the arena
    assert sample.members() == sorted(reader.read(0, 0)[1])  # what messages list: the image too
    assert sample.image() == bytes(sample.image_buffer()) == _image(reader, 0, 0)
    reader.close()
