"""The shared bad-sample policy: replacement when a whole batch is bad, keys in errors, and the
plain-callable transform's RNG isolation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader.read.bad_samples import SEARCH, BadSample, fill_batch


def _garble_middle(ds: Path, line: int = 1) -> str:
    """Zero the middle third of one sample's image bytes in shard 0 (header and end marker
    intact); return its key."""
    shard = ds / "shard-000000.tar"
    raw = bytearray(shard.read_bytes())
    key, offset, *_ = (ds / "shard-000000.idx").read_text().splitlines()[line].split()
    jpg_header = int(offset) + 1024  # cls header and data block, then the jpg header
    size = int(raw[jpg_header + 124: jpg_header + 135], 8)
    start = jpg_header + 512
    raw[start + size // 3: start + 2 * size // 3] = b"\x00" * (2 * size // 3 - size // 3)
    shard.write_bytes(bytes(raw))
    return key


def _keys_and_pixels(ds: Path, num_workers: int) -> tuple[list[tuple[list[str], torch.Tensor]], int]:
    loader = ShardLoader(str(ds), batch_size=1, transform=transforms.imagenet_train(32), keys=True,
                         shuffle=False, num_workers=num_workers, seed=3)
    got = [(list(k), x.clone()) for x, _, k in loader]
    return got, loader.stats.replaced


def test_batch_of_one_corrupt_sample_is_replaced_the_same_for_any_worker_count(packed: Path,
                                                                             tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    key = _garble_middle(ds)
    ref, replaced = _keys_and_pixels(ds, 0)
    assert replaced == 1 and len(ref) == 69
    keys = [k for ks, _ in ref for k in ks]
    assert key not in keys
    following = (ds / "shard-000000.idx").read_text().splitlines()[2].split()[0]
    assert keys[0] == keys[1] == following  # shuffle=False: the next sample of the shard stands in
    got, replaced_2 = _keys_and_pixels(ds, 2)
    assert replaced_2 == 1
    assert [k for k, _ in got] == [k for k, _ in ref]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, ref, strict=True))


def _fake_reader(size: int) -> SimpleNamespace:
    return SimpleNamespace(key=lambda shard, index: f"k{index}",
                           shards=SimpleNamespace(num_samples=[size], urls=["s.tar"]),
                           where=lambda shard: "/data/s.tar")


def test_fill_batch_replaces_within_the_batch_then_from_the_shard_then_raises_naming_keys() -> None:
    def attempt_good_above(limit: int):  # samples with index >= limit are good
        def attempt(slot: int, shard: int, index: int, seed: int) -> tuple[int, int]:
            if index < limit:
                raise BadSample(f"k{index} is bad")
            return index, seed
        return attempt

    reader = _fake_reader(100)
    got = fill_batch(attempt_good_above(1), reader, [0, 0, 0], [0, 1, 2], [7, 8, 9], on_error="replace")  # type: ignore[arg-type]
    assert got.keys == ["k1", "k1", "k2"] and got.results[0] == (1, 8) and got.copies == [(0, 1)] and got.replaced == 1
    assert [got.source(i) for i in range(3)] == [1, 1, 2]  # slot 0 holds slot 1's sample (its shard names it)
    got = fill_batch(attempt_good_above(5), reader, [0, 0], [0, 1], [7, 8], on_error="replace")  # type: ignore[arg-type]
    assert got.keys == ["k5", "k5"] and got.results == [(5, 7), (5, 7)] and got.replaced == 2
    with pytest.raises(LoaderError, match=r"k0, k1.*after k0") as info:
        fill_batch(attempt_good_above(SEARCH + 5), reader, [0, 0], [0, 1], [7, 8], on_error="replace")  # type: ignore[arg-type]
    assert info.value.where == "/data/s.tar"
    with pytest.raises(LoaderError, match="k0 is bad"):
        fill_batch(attempt_good_above(1), reader, [0], [0], [7], on_error="raise")  # type: ignore[arg-type]


def test_plain_callable_transform_leaves_the_global_rng_alone(packed: Path) -> None:
    def noisy(image: torch.Tensor) -> torch.Tensor:
        return image[:, :8, :8].float() + torch.rand(1)

    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    first = [x.clone() for x, _ in ShardLoader(str(packed), batch_size=8, transform=noisy, seed=2)]
    assert torch.equal(torch.rand(4), expected)
    again = [x for x, _ in ShardLoader(str(packed), batch_size=8, transform=noisy, seed=2)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # still seeded per sample


def test_the_first_replaced_sample_is_logged_with_its_shard_and_key(packed: Path, tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from shardkit.loader.read import bad_samples

    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    key = _garble_middle(ds)
    _garble_middle(ds, line=3)
    bad_samples._told.discard(os.getpid())
    with caplog.at_level("WARNING", logger="shardkit.loader"):
        _, replaced = _keys_and_pixels(ds, 0)
    said = [r.getMessage() for r in caplog.records if "replaced a bad sample" in r.getMessage()]
    assert replaced == 2 and len(said) == 1  # once per process; the count has the rest
    assert f"key {key} in " in said[0] and "shard-000000.tar" in said[0]


def test_an_undecodable_image_is_named_by_shard_and_key_under_every_transform() -> None:
    """The header peek of a crop-first transform used to raise without naming the sample."""
    from shardkit.codec.decode import DecodeStats
    from shardkit.loader.read.samples import decode_for

    for raw in (b"\xff\xd8\xff\xe0 not an image" * 3, b"plain text, not an image"):
        for transform in (transforms.imagenet_train(32), transforms.imagenet_val(32)):
            with pytest.raises(BadSample) as err:
                decode_for(transform, raw, 0, "s-000000.tar:00000007", DecodeStats())
            assert str(err.value).startswith("s-000000.tar:00000007: cannot "), err.value
            assert "object at 0x" not in str(err.value)
