"""A hostile or damaged ``index.json`` / ``.idx`` cannot make the loader write outside its cache,
allocate what the files do not hold, or fail with anything but an error naming the shard."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.errors import ManifestError
from shardkit.index.manifest import ShardEntry
from shardkit.index.manifest_io import read_manifest
from shardkit.loader.read.cache import ShardCache
from shardkit.loader.read.reader import ShardReader
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store


def _loader(url: str, cache: Path, **kw: Any) -> ShardLoader:
    return ShardLoader(url, batch_size=4, transform=transforms.imagenet_val(32), shuffle=False,
                       cache_dir=str(cache), **kw)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("sha", ["../../owned", "/ABSOLUTE/owned", "A" * 64, "a" * 63, "a" * 64 + "/.."])
def test_a_shard_hash_that_is_not_hex_is_refused_before_anything_is_written(
        indexed_tree: Path, tmp_path: Path, sha: str) -> None:
    url = f"memory://shardkit-tests/{uuid.uuid4().hex}/ds"
    pack(str(indexed_tree), url, options=PackOptions(max_count=40, seed=1), workers=1)
    fs = fsspec.filesystem("memory")
    doc = json.loads(fs.cat(f"{url}/index.json"))
    doc["shards"][1]["sha256"] = sha.replace("ABSOLUTE", str(tmp_path).lstrip("/"))
    del doc["table"]  # an index.json naming no table (an older shardkit's): the loader reads its shards
    fs.pipe(f"{url}/index.json", json.dumps(doc).encode())
    work = tmp_path / "work"
    (work / "a" / "b").mkdir(parents=True)
    cache = work / "a" / "b" / "cache"
    before = _files(tmp_path)
    with pytest.raises(ManifestError, match=r"shards\[1\]\.sha256 .* is not 64 lower-case hex digits") as err:
        _loader(url, cache)
    assert "index.json" in str(err.value) and doc["shards"][1]["url"] in str(err.value)
    assert _files(tmp_path) == before  # no owned.tar, no owned.tar.lock anywhere


def test_the_cache_itself_refuses_a_hash_that_would_leave_its_directory(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"))
    outside = tmp_path / "owned"
    entry = ShardEntry("s.tar", 1, 1024, str(outside))  # built directly, past the manifest's checks
    with pytest.raises(LoaderError, match="not 64 lower-case hex digits"):
        cache.open(Store("memory://x"), entry)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"url": "a\0b.tar"}, r"shards\[0\]\.url .* NUL"),
        ({"num_samples": 10**12}, r"claims 1000000000000 samples in \d+ bytes"),
    ],
)
def test_impossible_shard_claims_are_refused(packed: Path, tmp_path: Path, change: dict[str, Any],
                                             message: str) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    doc = json.loads((ds / "index.json").read_text())
    doc["shards"][0].update(change)
    doc["num_samples"] = sum(s["num_samples"] for s in doc["shards"])
    del doc["table"]  # an index.json naming no table (an older shardkit's): the loader reads its shards
    (ds / "index.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=message):
        _loader(str(ds), tmp_path / "cache")


def test_a_local_shard_whose_size_differs_from_the_manifest_is_refused_before_planning(
        packed: Path, tmp_path: Path) -> None:
    """num_samples and num_bytes raised together pass the manifest's own checks; the reader
    compares num_bytes with the file before the loader allocates an epoch of 2e8 ids."""
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    doc = json.loads((ds / "index.json").read_text())
    doc["shards"][0].update(num_samples=2 * 10**8, num_bytes=2 * 10**8 * 512)
    doc["num_samples"] = sum(s["num_samples"] for s in doc["shards"])
    del doc["table"]  # an index.json naming no table (an older shardkit's): the loader reads its shards
    (ds / "index.json").write_text(json.dumps(doc))
    with pytest.raises(LoaderError, match=r"shard has [0-9,]+ bytes, index.json says 102,400,000,000") as err:
        _loader(str(ds), tmp_path / "cache")
    assert err.value.where.endswith(doc["shards"][0]["url"])


def test_in_a_dataset_too_large_to_stat_each_shard_the_claims_are_checked_before_planning(
        packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shardkit.loader.read.claims.CHECKED_WHOLE", 1)
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    doc = json.loads((ds / "index.json").read_text())
    doc["shards"][0].update(num_samples=2 * 10**8, num_bytes=2 * 10**8 * 512)
    doc["num_samples"] = sum(s["num_samples"] for s in doc["shards"])
    del doc["table"]
    (ds / "index.json").write_text(json.dumps(doc))
    claims = r"claims 200000\d\d\d samples in its 7 shards, but their files hold \d+ bytes"
    with pytest.raises(LoaderError, match=claims) as err:
        _loader(str(ds), tmp_path / "cache")
    assert doc["shards"][0]["url"] in str(err.value)


def _rewrite_idx(ds: Path, shard: str, edit: Any) -> None:
    idx = ds / shard.replace(".tar", ".idx")
    lines = idx.read_text().splitlines()
    edit(lines)
    idx.write_text("\n".join(lines) + "\n")


def _span_edit(line: int, key: str | None = None, offset: int | None = None, size: int | None = None) -> Any:
    def edit(lines: list[str]) -> None:
        k, o, n, *crc = lines[line].split()
        lines[line] = " ".join([key or k, str(o if offset is None else offset), str(n if size is None else size), *crc])
    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_span_edit(2, size=2_500_000_256), r"line 3: sample .* spans 2500000256 bytes, more than the \d+ a sample"),
        (_span_edit(2, size=1 << 20), r"line 3: sample .* ends at byte \d+, past the shard's \d+ bytes"),
        (_span_edit(2, offset=513), r"line 3: .*not a multiple of 512"),
        (_span_edit(3, offset=0), r"line 4: .*overlaps"),
    ],
)
def test_an_offsets_file_is_checked_against_its_shard_before_anything_is_read(
        packed: Path, tmp_path: Path, edit: Any, message: str) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    shard = json.loads((ds / "index.json").read_text())["shards"][0]["url"]
    _rewrite_idx(ds, shard, edit)
    reader = ShardReader(Store(str(ds)), _manifest_shards(ds))
    with pytest.raises(LoaderError, match=message) as err:
        reader.read(0, 0)
    assert shard.replace(".tar", ".idx") in str(err.value)


def test_an_offsets_key_that_differs_from_the_shard_is_refused(packed: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    shard = json.loads((ds / "index.json").read_text())["shards"][0]["url"]
    _rewrite_idx(ds, shard, _span_edit(2, key="99999999"))
    reader = ShardReader(Store(str(ds)), _manifest_shards(ds))
    reader.read(0, 0)
    with pytest.raises(LoaderError, match=r"99999999: the offsets file names this sample '99999999', the shard "):
        reader.read(0, 1)
    reader.close()


def _manifest_shards(ds: Path) -> Sequence[ShardEntry]:
    from shardkit.index.manifest_io import read_manifest

    return read_manifest(Store(str(ds))).shards


def test_of_many_shards_those_claiming_the_most_are_checked_before_planning(
        packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past CHECKED_WHOLE shards, a stat per shard would cost seconds (5e5 shards): the shards
    claiming the most samples are the ones compared with their files up front."""
    from shardkit.loader.read.claims import CHECKED_UP_FRONT

    monkeypatch.setattr("shardkit.loader.read.claims.CHECKED_WHOLE", CHECKED_UP_FRONT)

    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    entry = read_manifest(Store(str(ds))).shards[0]
    many = [ShardEntry(f"s-{i:06d}.tar", 1, entry.num_bytes, entry.sha256) for i in range(2 * CHECKED_UP_FRONT)]
    for e in many[1:]:
        os.link(ds / entry.url, ds / e.url)
    many[0] = ShardEntry(many[0].url, 10**6, 10**6 * 512, entry.sha256)  # its file holds fewer than claimed
    (ds / many[0].url).write_bytes(b"\0" * 1024)
    with pytest.raises(LoaderError, match=rf"claims \d+ samples in the {CHECKED_UP_FRONT} shards claiming the most"):
        ShardReader(Store(str(ds)), many)


@pytest.mark.parametrize("table", [True, False])
def test_a_shard_listed_twice_is_refused(packed: Path, tmp_path: Path, table: bool) -> None:
    """Each of its samples would come twice an epoch (and the shard's checks pass twice)."""
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    doc = json.loads((ds / "index.json").read_text())
    doc["shards"].append(dict(doc["shards"][0]))
    doc["num_samples"] = sum(s["num_samples"] for s in doc["shards"])
    if not table:
        del doc["table"]
    (ds / "index.json").write_text(json.dumps(doc))
    first = doc["shards"][0]["url"]
    with pytest.raises(ManifestError, match=rf"shards\[{len(doc['shards']) - 1}\]\.url '{first}' is listed twice"):
        _loader(str(ds), tmp_path / "cache")
