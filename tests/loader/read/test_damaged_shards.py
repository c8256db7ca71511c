"""Damaged local shards: a damaged sample is a ``CorruptSample`` naming shard and key (the rest
of the shard stays readable), and ``verify_hashes=True`` detects every damaged byte."""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from shardkit.errors import FormatError, LoaderError
from shardkit.format.offsets import load_offsets
from shardkit.format.tarread import iter_entries
from shardkit.index.manifest_io import read_manifest
from shardkit.loader.read.reader import CorruptSample, ShardReader
from shardkit.storage import Store


def _copy(packed: Path, tmp_path: Path) -> tuple[Path, Store]:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    return ds, Store(str(ds))


def _flip(path: Path, pos: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_a_damaged_header_is_a_corrupt_sample_and_its_neighbours_stay_readable(packed: Path, tmp_path: Path) -> None:
    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    shard = ds / shards[0].url
    entries = list(iter_entries(io.BytesIO(shard.read_bytes()), where="x", read_data=False))
    second = next(e for e in entries if not e.name.startswith(entries[0].name.split(".")[0]))
    _flip(shard, second.offset + 3, 5)  # a bit of the second sample's first member name
    _without_checksums(shard)  # (with them, the checksum names it first)
    reader = ShardReader(store, shards)
    key0, _ = reader.read(0, 0)
    with pytest.raises(CorruptSample, match="corrupt tar header") as err:
        reader.read(0, 1)
    assert isinstance(err.value, LoaderError)
    assert err.value.where.endswith(f"{shards[0].url}:{reader.key(0, 1)}")
    assert reader.read(0, 2)[0] == reader.key(0, 2)
    reader.close()


def test_a_truncated_shard_is_a_shard_error_not_a_sample_to_replace(packed: Path, tmp_path: Path) -> None:
    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    shard = ds / shards[0].url
    reader = ShardReader(store, shards)  # cut short after the reader checked the files
    shard.write_bytes(shard.read_bytes()[:4000])
    reader.read(0, 0)
    with pytest.raises(LoaderError, match="shard is truncated") as err:
        reader.read(0, shards[0].num_samples - 1)
    assert not isinstance(err.value, CorruptSample)
    reader.close()


def test_verify_hashes_catches_a_flip_that_no_parser_sees(packed: Path, tmp_path: Path) -> None:
    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    _flip(ds / shards[1].url, shards[1].num_bytes - 5)  # inside the end-of-archive blocks
    plain = ShardReader(store, shards)
    assert [plain.read(1, i)[0] for i in range(shards[1].num_samples)]  # read silently
    plain.close()
    checked = ShardReader(store, shards, verify_hashes=True)
    checked.read(0, 0)
    with pytest.raises(LoaderError, match="shard's bytes differ from index.json") as err:
        checked.read(1, 0)
    assert err.value.where.endswith(shards[1].url)
    checked.close()


def test_verify_hashes_detects_every_one_of_40_random_bit_flips(packed: Path, tmp_path: Path) -> None:
    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    shard = ds / shards[0].url
    original = shard.read_bytes()
    rng = random.Random(14)
    for _ in range(40):
        data = bytearray(original)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
        reader = ShardReader(store, shards, verify_hashes=True)
        with pytest.raises(LoaderError, match="differ from index.json"):
            reader.read(0, 0)
        reader.close()


def _member(shard: Path, key: str, ext: str) -> int:
    """Byte offset of the data of ``key.ext`` in ``shard``."""
    entries = iter_entries(io.BytesIO(shard.read_bytes()), where="x", read_data=False)
    return next(e.data_offset for e in entries if e.name == f"{key}.{ext}")


def test_the_loader_replaces_a_damaged_sample_or_names_it(packed: Path, tmp_path: Path) -> None:
    """A damaged sample is a bad sample like an undecodable image: replaced and counted by
    default, named with its shard and key under on_error='raise'."""
    from shardkit import ShardLoader, transforms

    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    reader = ShardReader(store, shards)
    key = reader.key(0, 1)
    reader.close()
    entries = list(iter_entries(io.BytesIO((ds / shards[0].url).read_bytes()), where="x", read_data=False))
    first = next(e for e in entries if e.name.startswith(key + "."))
    _flip(ds / shards[0].url, first.offset + 3, 5)
    kw = {"batch_size": 8, "transform": transforms.imagenet_val(32), "shuffle": False, "keys": True}
    loader = ShardLoader(str(ds), **kw)  # type: ignore[arg-type]
    keys = [k for _x, _y, ks in loader for k in ks]
    assert key not in keys and loader.stats.replaced >= 1  # (padding may repeat it)
    with pytest.raises(LoaderError, match=f"bad sample .*{shards[0].url}:{key}"):
        list(ShardLoader(str(ds), on_error="raise", **kw))  # type: ignore[arg-type]


def test_a_label_outside_the_classes_is_a_bad_sample(packed: Path, tmp_path: Path) -> None:
    from shardkit import ShardLoader, transforms

    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    assert len(read_manifest(store).classes or ()) == 3
    reader = ShardReader(store, shards)
    key = reader.key(0, 0)
    reader.close()
    shard = ds / shards[0].url
    pos = _member(shard, key, "cls")
    data = bytearray(shard.read_bytes())
    data[pos] = ord("7")  # class 7 of 3 (same length: the tar stays well-formed)
    shard.write_bytes(bytes(data))
    _without_checksums(shard)  # (with them, the checksum names it first)
    kw = {"batch_size": 8, "transform": transforms.imagenet_val(32), "shuffle": False, "keys": True}
    loader = ShardLoader(str(ds), **kw)  # type: ignore[arg-type]
    labels = [int(y) for _x, ys, _k in loader for y in ys]
    assert max(labels) < 3 and loader.stats.replaced >= 1  # (padding may repeat it)
    with pytest.raises(LoaderError, match=f"{key}: label 7 is outside the dataset's 3 classes"):
        list(ShardLoader(str(ds), on_error="raise", **kw))  # type: ignore[arg-type]


def test_the_loader_verifies_hashes_when_asked(packed: Path, tmp_path: Path) -> None:
    from shardkit import ShardLoader

    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    _flip(ds / shards[0].url, shards[0].num_bytes - 5)  # in the end-of-archive blocks: no parser sees it
    assert len(list(ShardLoader(str(ds), batch_size=8))) > 0
    with pytest.raises(LoaderError, match="shard's bytes differ from index.json"):
        list(ShardLoader(str(ds), batch_size=8, verify_hashes=True))


def test_flipped_image_bytes_are_a_corrupt_sample_by_their_checksum(packed: Path, tmp_path: Path) -> None:
    """A flip inside a JPEG's data decodes to garbage, unnoticed by any parser: the sample's CRC-32
    in the offsets file catches it on every read, without verify_hashes; the loader replaces it."""
    from shardkit import ShardLoader, transforms

    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    shard = ds / shards[0].url
    reader = ShardReader(store, shards)
    key = reader.key(0, 1)
    image = next(e for e in ("jpg", "png") if any(n.startswith(f"{key}.{e}") for n in _names(shard)))
    _flip(shard, _member(shard, key, image) + 40, 3)
    assert reader.read(0, 0)[0] == reader.key(0, 0)
    with pytest.raises(CorruptSample, match="checksum mismatch: its bytes changed after packing or indexing") as err:
        reader.read(0, 1)
    assert err.value.where.endswith(f"{shards[0].url}:{key}")
    reader.close()
    kw = {"batch_size": 8, "transform": transforms.imagenet_val(32), "shuffle": False, "keys": True}
    loader = ShardLoader(str(ds), **kw)  # type: ignore[arg-type]
    assert key not in [k for _x, _y, ks in loader for k in ks] and loader.stats.replaced >= 1


def test_every_one_of_40_random_flips_inside_samples_is_caught_on_read(packed: Path, tmp_path: Path) -> None:
    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    shard = ds / shards[0].url
    original = shard.read_bytes()
    last = load_offsets((ds / shards[0].url.replace(".tar", ".idx")).read_bytes(), where="idx")[-1]
    end = last.offset + last.size  # the samples' bytes; the end-of-archive blocks follow
    rng = random.Random(15)
    for _ in range(40):
        data = bytearray(original)
        data[rng.randrange(end)] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
        reader = ShardReader(store, shards)
        with pytest.raises(LoaderError):
            for i in range(shards[0].num_samples):
                reader.read(0, i)
        reader.close()


def test_an_offsets_file_of_version_1_still_reads(packed: Path, tmp_path: Path) -> None:
    """Packs made before checksums: no CRC to check, read as before."""
    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    _without_checksums(ds / shards[0].url)
    reader = ShardReader(store, shards)
    assert [reader.read(0, i)[0] for i in range(shards[0].num_samples)] == [reader.key(0, i) for i in
                                                                           range(shards[0].num_samples)]
    reader.close()


def _without_checksums(shard: Path) -> None:
    """Rewrite the shard's offsets file as version 1 (no CRC-32), as packs before checksums and
    adopted shards have: the checks beneath the checksum are what guards those."""
    idx = shard.with_suffix(".idx")
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join([lines[0].replace(" 2 ", " 1 "), *(" ".join(ln.split()[:3]) for ln in lines[1:])]) + "\n")


def _names(shard: Path) -> list[str]:
    return [e.name for e in iter_entries(io.BytesIO(shard.read_bytes()), where="x", read_data=False)]


def test_a_damaged_offsets_file_says_what_to_do(packed: Path, tmp_path: Path) -> None:
    from shardkit import ShardLoader

    ds, _store = _copy(packed, tmp_path)
    idx = sorted(ds.glob("*.idx"))[0]
    idx.write_bytes(b"XXXX" + idx.read_bytes()[4:])
    with ShardLoader(str(ds), batch_size=4, shuffle=False) as loader, pytest.raises(FormatError) as info:
        list(loader)
    assert str(info.value) == (f"{idx}: not a shardkit offsets file; it is damaged or another tool's: copy it again "
                               "with its shard, or delete it to have the shard scanned instead (its samples then go "
                               "unchecked against their CRC-32s)")
    idx.unlink()  # as the message says: the shard is then scanned
    with ShardLoader(str(ds), batch_size=4, shuffle=False) as loader:
        assert sum(len(labels) for _images, labels in loader) == read_manifest(Store(str(ds))).num_samples


def test_a_shard_written_again_at_the_same_size_is_refused_not_replaced_sample_by_sample(
        packed: Path, tmp_path: Path) -> None:
    """Each sample's bytes differ from its CRC-32 (a shard rewritten in place, its size kept): the
    loader replaced every one with another sample of the batch and trained on duplicates. Its
    first differing sample has the shard looked at, whatever other shards are read meanwhile; a
    shard whose first samples alone are damaged is not taken for one written again."""
    from shardkit import ShardLoader, transforms

    ds, store = _copy(packed, tmp_path)
    shards = read_manifest(store).shards
    shard = ds / shards[0].url
    reader = ShardReader(store, shards)
    keys = [reader.key(0, i) for i in range(shards[0].num_samples)]
    reader.close()
    original = shard.read_bytes()

    def damage(which: list[str]) -> None:
        shard.write_bytes(original)
        for key in which:
            image = next(e for e in ("jpg", "png") if any(n.startswith(f"{key}.{e}") for n in _names(shard)))
            _flip(shard, _member(shard, key, image) + 40, 1)
        assert shard.stat().st_size == shards[0].num_bytes

    damage(keys)
    kw: dict[str, Any] = {"batch_size": 4, "transform": transforms.imagenet_val(32), "shuffle": False}
    with pytest.raises(LoaderError, match=rf"{shards[0].url}: shard's bytes changed since it was packed or indexed: "
                                          r"this sample and the \d+ others looked at, spread through it, all differ"):
        list(ShardLoader(str(ds), **kw))
    reader = ShardReader(store, shards)
    with pytest.raises(LoaderError, match="shard's bytes changed"):
        reader.read(0, 3)  # its first read, with or without others before it
    reader.close()
    damage(keys[:4])  # damaged, not written again: those four are replaced, the rest read
    loader = ShardLoader(str(ds), keys=True, **kw)
    delivered = [k for _x, _y, ks in loader for k in ks]
    assert loader.stats.replaced == 4 and not set(keys[:4]) & set(delivered) and set(keys[4:]) <= set(delivered)
