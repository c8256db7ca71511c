"""The shard table beside index.json: the same manifest, read by column; stale or hostile tables refused."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.errors import ManifestError
from shardkit.index import Manifest, ShardEntry, ShardTable, read_manifest, write_manifest
from shardkit.index.manifest import MAX_MANIFEST_BYTES
from shardkit.index.manifest_io import names_table
from shardkit.index.shards import HASH_BLOCK
from shardkit.index.table import decode_table, encode_table
from shardkit.loader.epochs.state import dataset_identity
from shardkit.storage import Store


def _manifest(n: int = 3, urls: list[str] | None = None, **kw: Any) -> Manifest:
    names = urls or [f"shard-{i:06d}.tar" for i in range(n)]
    shards = [ShardEntry(u, 2 + i % 3, 10240 + 512 * i, hashlib.sha256(u.encode()).hexdigest())
              for i, u in enumerate(names)]
    base: dict[str, Any] = dict(kind="imagefolder", shards=shards, classes=("cat", "dog"),
                                skipped=({"source": "cat/x.jpg", "reason": "empty file (0 bytes)"},),
                                options={"max_count": 4, "prefix": "shard"}, created_by="shardkit test")
    return Manifest(**{**base, **kw})


class CountingStore(Store):
    """A store that records the files and ranges read from it."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[tuple[str, int | None]] = []

    def read_bytes(self, name: str, *, limit: int | None = None) -> bytes:
        self.reads.append((name, limit))
        return super().read_bytes(name, limit=limit)

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        self.reads.append((name, offset))
        return super().read_range(name, offset, length)


@pytest.mark.parametrize("urls", [None, ["b/x.tar", "ça.tar", "a.tar"]], ids=["pattern", "listed"])
def test_the_table_gives_the_manifest_index_json_gives(tmp_path: Path, urls: list[str] | None) -> None:
    m = _manifest(urls=urls)
    write_manifest(Store(str(tmp_path)), m)
    store = CountingStore(str(tmp_path))
    got = read_manifest(store)
    assert [name for name, _ in store.reads] == ["index.json", "index.table"]  # the head of index.json only
    assert store.reads[0][1] is not None
    assert got == m == read_manifest(Store(str(tmp_path)), table=False)
    assert got.head() == m.head() and list(got.table.num_samples) == [2, 3, 4]
    assert got.shards[2] == m.shards[2] and store.reads[-1] == ("index.hashes", 0)  # fetched when asked for
    assert dataset_identity([got.table.fingerprint]) == dataset_identity([m.table.fingerprint])
    doc = json.loads((tmp_path / "index.json").read_bytes())
    assert list(doc)[:5] == ["format", "version", "kind", "num_samples", "table"]
    assert doc["table"]["sha256"] == hashlib.sha256((tmp_path / "index.table").read_bytes()).hexdigest()
    assert (tmp_path / "index.hashes").read_bytes() == b"".join(bytes.fromhex(s.sha256) for s in m.shards)


def test_hashes_are_read_by_block_and_checked(tmp_path: Path) -> None:
    m = _manifest(HASH_BLOCK + 5)
    write_manifest(Store(str(tmp_path)), m)
    store = CountingStore(str(tmp_path))
    got = read_manifest(store)
    assert got.table.sha256(HASH_BLOCK + 1) == m.shards[HASH_BLOCK + 1].sha256
    assert store.reads[-1] == ("index.hashes", 32 * HASH_BLOCK)
    hashes = bytearray((tmp_path / "index.hashes").read_bytes())
    hashes[5] ^= 1
    (tmp_path / "index.hashes").write_bytes(bytes(hashes))
    assert got.table.sha256(HASH_BLOCK + 2) == m.shards[HASH_BLOCK + 2].sha256  # its block was read before
    damaged = (rf"index.hashes: damaged or stale: block 0 \(the hashes of shards 0 to {HASH_BLOCK - 1}\) .* "
               rf"\(write it again: `shardkit index --table {tmp_path}`\)$")
    with pytest.raises(ManifestError, match=damaged):
        read_manifest(Store(str(tmp_path))).shards[3]


def test_a_dataset_without_a_table_loads_and_gets_one(tmp_path: Path) -> None:
    m = _manifest()
    (tmp_path / "index.json").write_bytes(m.to_json())  # as shardkit wrote it before the table existed
    assert read_manifest(Store(str(tmp_path))) == m
    result = CliRunner().invoke(cli, ["index", "--table", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "wrote index.table and index.hashes for 3 shards" in result.output
    assert json.loads((tmp_path / "index.json").read_bytes())["table"]["url"] == "index.table"
    assert read_manifest(Store(str(tmp_path))) == m


def test_a_stale_or_missing_table_is_passed_over_for_index_json_with_a_warning_naming_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """index.json is what the table stands for: a table written with another index.json (one a
    JSON tool rewrote since, another dataset's) or missing is named in a warning, once, and
    index.json is read in full; verify (strict_table) still refuses it, naming the file."""
    from shardkit.index import manifest_io

    store = Store(str(tmp_path))
    write_manifest(store, _manifest())
    doc = json.loads((tmp_path / "index.json").read_bytes())
    doc["shards"][0]["num_samples"] += 1  # edited by a JSON tool that kept the table's reference
    doc["num_samples"] += 1
    (tmp_path / "index.json").write_text(json.dumps(doc))
    manifest_io._warned.clear()
    with caplog.at_level("WARNING", logger="shardkit.index"):
        edited = read_manifest(store)
        assert read_manifest(store) == edited  # warned once
    assert edited.num_samples == 10 and edited.shards[0].num_samples == doc["shards"][0]["num_samples"]
    [record] = [r.getMessage() for r in caplog.records]
    assert re.search(r"index.table: stale: .* an index.json whose num samples is 9, this one's is 10 \(write it "
                     r"again: `shardkit index --table .*`\); read index.json in full instead", record), record
    with pytest.raises(ManifestError, match=r"index.table: stale: .* index.json whose num samples is 9, this one's "
                                            r"is 10 \(write it again: `shardkit index --table"):
        read_manifest(store, strict_table=True)
    doc["shards"][0]["num_samples"] -= 1
    doc["num_samples"] -= 1
    (tmp_path / "index.json").write_text(json.dumps(doc, indent=1))  # the same fields, laid out anew
    assert read_manifest(store) == _manifest()
    with pytest.raises(ManifestError, match=r"index.table: stale: .* index bytes is \d+, this one's is \d+"):
        read_manifest(store, strict_table=True)
    write_manifest(store, _manifest())
    table = (tmp_path / "index.table").read_bytes()
    write_manifest(store, _manifest(4))
    (tmp_path / "index.table").write_bytes(table)  # another dataset's table
    assert len(read_manifest(store).shards) == 4
    with pytest.raises(ManifestError, match=r"index.table: stale or damaged: \d+ bytes with sha256 [0-9a-f]{16}…, "
                                            r"index.json names \d+ bytes with"):
        read_manifest(store, strict_table=True)
    (tmp_path / "index.table").unlink()
    assert len(read_manifest(store).shards) == 4
    with pytest.raises(ManifestError, match="index.table: missing, though index.json names it"):
        read_manifest(store, strict_table=True)
    assert len(read_manifest(store, table=False).shards) == 4


def test_an_index_cut_short_is_named_as_such_not_as_a_stale_table(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    write_manifest(store, _manifest())
    data = (tmp_path / "index.json").read_bytes()
    (tmp_path / "index.json").write_bytes(data[: len(data) // 2])  # a copy that stopped half-way
    with pytest.raises(ManifestError, match=r"index.json: not valid JSON \("):
        read_manifest(store)


def test_a_remote_table_is_fetched_once_per_node_and_checked_there(tmp_path: Path) -> None:
    url = "memory://shardkit-tests/table-node"
    write_manifest(Store(url), _manifest())
    cache = tmp_path / "cache"
    first, second = CountingStore(url), CountingStore(url)
    assert read_manifest(first, cache_dir=str(cache)) == read_manifest(second, cache_dir=str(cache))
    assert "index.table" in [n for n, _ in first.reads] and "index.table" not in [n for n, _ in second.reads]
    [copy] = [p for p in cache.iterdir()]
    assert copy.name.endswith(".table") and copy.read_bytes() == Store(url).read_bytes("index.table")
    copy.write_bytes(b"x" * len(copy.read_bytes()))  # damaged on the node: fetched again
    third = CountingStore(url)
    assert read_manifest(third, cache_dir=str(cache)) == _manifest()
    assert "index.table" in [n for n, _ in third.reads] and copy.read_bytes()[:14] == b"shardkit-table"


def _table(n: int = 3, **head: Any) -> bytes:
    data, _ = encode_table(_manifest(n).head(), ShardTable.from_entries(_manifest(n).shards), index_bytes=1)
    if not head:
        return data
    line, rest = data.split(b"\n", 1)
    (size,) = struct.unpack_from("<I", rest)
    doc = {**json.loads(rest[4:4 + size]), **head}
    text = json.dumps(doc).encode()
    return line + b"\n" + struct.pack("<I", len(text)) + text + rest[4 + size:]


def _with_body(body: bytes, **head: Any) -> bytes:
    data = _table(body_bytes=len(body), columns={"num_samples": "<u4", "num_bytes": "<u8"}, **head)
    line, rest = data.split(b"\n", 1)
    (size,) = struct.unpack_from("<I", rest)
    return line + b"\n" + rest[:4 + size] + zlib.compress(body)


def _body(counts: list[int], sizes: list[int], tail: bytes = b"") -> bytes:
    digests = hashlib.sha256(bytes(32 * len(counts))).digest()
    return struct.pack(f"<{len(counts)}I", *counts) + struct.pack(f"<{len(sizes)}Q", *sizes) + digests + tail


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"PK\x03\x04", "not a shardkit table"),
        (b"shardkit-table 7\n", "table version '7' is not supported"),
        (_table()[:40], "table head claims"),
        (_table()[:-3], "table body is damaged|table body holds"),
        (_table() + b"extra", "table body holds"),
        (_table(num_shards=2**30), "table lists 1073741824 shards"),
        (_table(columns={"num_samples": "<f8", "num_bytes": "<u8"}), "table columns"),
        (_table(hashes={"url": "../x", "block": HASH_BLOCK}), "table hashes"),
        (_table(urls={"prefix": "../up"}), "table urls: invalid shard prefix"),
        (_with_body(_body([1, 3], [512, 1024]), num_shards=2), "shard 1 claims 3 samples in 1024 bytes"),
        (_with_body(_body([1], [512], b"/etc/passwd"), num_shards=1, urls=None),
         "url '/etc/passwd' is empty or not relative"),
        (_with_body(_body([1, 1], [512, 512], b"a.tar\0../b.tar"), num_shards=2, urls=None), "url '../b.tar'"),
        (_with_body(_body([1, 1], [512, 512], b"a.tar"), num_shards=2, urls=None), "1 urls for 2 shards"),
        (_with_body(_body([1, 1], [512, 512], b"a.tar\0a.tar"), num_shards=2, urls=None),
         "table lists shard 'a.tar' twice"),
    ],
)
def test_a_hostile_table_is_refused_with_one_line_naming_it(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message) as err:
        decode_table(data, where="/d/index.table", read_hashes=lambda o, n: b"", hashes_where="/d/index.hashes")
    assert str(err.value).startswith("/d/index.table: ") and "\n" not in str(err.value)


def test_verify_compares_the_table_with_index_json(tmp_path: Path) -> None:
    from shardkit.index import verify_dataset

    store = Store(str(tmp_path))
    write_manifest(store, _manifest())
    text = (tmp_path / "index.json").read_text()
    first = _manifest().shards[0].sha256
    (tmp_path / "index.json").write_text(text.replace(first, first[:-1] + ("0" if first[-1] != "0" else "1")))
    problems = verify_dataset(str(tmp_path)).problems  # the shard files are missing too: named apart
    assert f"{tmp_path}/index.table: holds other shards or fields than index.json (write it again" in problems[0]
    write_manifest(store, _manifest())
    doc = json.loads((tmp_path / "index.json").read_bytes())
    (tmp_path / "index.json").write_text(json.dumps(doc))  # rewritten by a JSON tool: the table is stale
    assert "index.table: stale: it was written with an index.json whose index bytes" in \
        verify_dataset(str(tmp_path)).problems[0]
    write_manifest(store, _manifest())
    (tmp_path / "index.hashes").write_bytes(b"\0" * 96)
    assert "index.hashes: damaged or stale: block 0 (the hashes of shards 0 to 2)" in \
        verify_dataset(str(tmp_path)).problems[0]


def test_a_missing_hashes_file_says_how_to_write_it_again(tmp_path: Path) -> None:
    """A local dataset without its index.hashes is read from index.json (with the warning of a stale
    table) instead of failing at its first shard; verify names the file; where the file goes missing
    after the manifest was read (or on a remote store, where it is not looked for up front), the
    first shard whose hash is needed names it."""
    store = Store(str(tmp_path))
    write_manifest(store, _manifest())
    (tmp_path / "index.hashes").unlink()
    assert read_manifest(store).shards[0].sha256 == _manifest().shards[0].sha256
    missing = (rf"^{tmp_path}/index.hashes: missing, though index.table names it \(copy it with the dataset, or "
               rf"write it again: `shardkit index --table {tmp_path}`")
    with pytest.raises(ManifestError, match=missing):
        read_manifest(store, strict_table=True)
    write_manifest(store, _manifest())
    manifest = read_manifest(store)  # the hashes are read when asked for
    (tmp_path / "index.hashes").unlink()
    with pytest.raises(ManifestError, match=missing):
        _ = manifest.shards[0].sha256
    result = CliRunner().invoke(cli, ["index", "--table", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert read_manifest(store).shards[0].sha256 == _manifest().shards[0].sha256


@pytest.mark.parametrize("size", [0, 50, 32 * (HASH_BLOCK + 6)])
def test_a_hashes_file_of_the_wrong_size_is_passed_over_as_a_missing_one(tmp_path: Path, size: int) -> None:
    """An index.hashes emptied, cut short or grown (by a copy that failed, a sync tool) is found by
    its size when the manifest is read: the loader reads index.json in full (with the warning of a
    stale table), verify prints the problem with the fix, not a traceback, and the fix mends it."""
    store = Store(str(tmp_path))
    m = _manifest(HASH_BLOCK + 5)
    write_manifest(store, m)
    whole = (tmp_path / "index.hashes").read_bytes()
    (tmp_path / "index.hashes").write_bytes((whole * 2)[:size])
    assert read_manifest(store).shards[HASH_BLOCK + 4].sha256 == m.shards[HASH_BLOCK + 4].sha256
    wrong = (rf"^{tmp_path}/index.hashes: damaged or stale: {size:,} bytes, where index.table's {HASH_BLOCK + 5} "
             rf"shards need {32 * (HASH_BLOCK + 5):,} \(32 each; write it again: "
             rf"`shardkit index --table {tmp_path}`\)$")
    with pytest.raises(ManifestError, match=wrong):
        read_manifest(store, strict_table=True)
    result = CliRunner().invoke(cli, ["verify", "-q", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"FAIL {tmp_path}/index.hashes: damaged or stale: {size:,} bytes" in result.output
    assert CliRunner().invoke(cli, ["index", "--table", str(tmp_path)]).exit_code == 0
    assert (tmp_path / "index.hashes").read_bytes() == whole


def test_verify_reports_a_damaged_hash_block_and_a_hashes_folder(tmp_path: Path) -> None:
    """A hashes file of the right size with a damaged byte is found only when its block is read:
    verify reports it as a problem with the fix (its progress bar's totals read no hash); a folder
    in the file's place is refused when the manifest is read, whatever its size."""
    store = Store(str(tmp_path))
    write_manifest(store, _manifest(HASH_BLOCK + 5))
    hashes = bytearray((tmp_path / "index.hashes").read_bytes())
    hashes[32 * HASH_BLOCK + 3] ^= 1
    (tmp_path / "index.hashes").write_bytes(bytes(hashes))
    result = CliRunner().invoke(cli, ["verify", "-q", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert (f"FAIL {tmp_path}/index.hashes: damaged or stale: block 1 (the hashes of shards {HASH_BLOCK} to "
            f"{HASH_BLOCK + 4})") in result.output
    (tmp_path / "index.hashes").unlink()
    (tmp_path / "index.hashes").mkdir()
    with pytest.raises(ManifestError, match=r"index.hashes: not a file \(write it again: `shardkit index --table"):
        read_manifest(store, strict_table=True)


def test_a_captioned_datasets_table_is_read_and_checked_as_any_other(tmp_path: Path) -> None:
    """Captions write kind_version between kind and num_samples: their index.json names the
    table all the same, it is read from the first bytes, and a kind_version this shardkit does not
    read is refused there as in the full read."""
    store = CountingStore(str(tmp_path))
    m = _manifest(kind="captions", classes=None)
    write_manifest(store, m)
    assert names_table(store)
    assert read_manifest(store) == m
    assert ("index.table", None) not in store.reads and any(n == "index.table" for n, _ in store.reads)
    assert ("index.json", MAX_MANIFEST_BYTES + 1) not in store.reads  # not read in full
    (tmp_path / "index.table").unlink()
    with pytest.raises(ManifestError, match="index.table: missing, though index.json names it"):
        read_manifest(store, strict_table=True)
    data = (tmp_path / "index.json").read_bytes()
    (tmp_path / "index.json").write_bytes(data.replace(b'"kind_version": 1', b'"kind_version": 7', 1))
    with pytest.raises(ManifestError, match="captions samples of kind_version 7 are not supported"):
        read_manifest(store)


def test_an_index_json_rewritten_is_read_once_when_its_table_is_passed_over(tmp_path: Path) -> None:
    store = CountingStore(str(tmp_path))
    write_manifest(store, _manifest())
    (tmp_path / "index.json").write_text(json.dumps(json.loads((tmp_path / "index.json").read_bytes()), indent=3))
    store.reads.clear()
    assert read_manifest(store) == _manifest()
    assert [n for n, limit in store.reads if n == "index.json" and limit == MAX_MANIFEST_BYTES + 1] == ["index.json"]
