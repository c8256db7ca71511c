"""``shardkit index`` records each adopted sample's CRC-32 (offsets file version 2), read in the
same pass as the shard's sha256: bytes changed after indexing are a corrupt sample the loader
replaces or names, as in a pack, not a wrong label delivered without a word."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import ShardLoader
from shardkit.cli import cli
from shardkit.errors import LoaderError
from shardkit.format.offsets import load_offsets
from shardkit.format.spec import offsets_name
from shardkit.index import read_manifest
from shardkit.index.adopt import adopt_shards
from shardkit.storage import Store
from tests.conftest import encode_image

wds = pytest.importorskip("webdataset")


def _shardwriter(root: Path, n: int = 12, image_bytes: int = 0) -> Path:
    root.mkdir(parents=True)
    with wds.ShardWriter(str(root / "w-%06d.tar"), maxcount=5) as sink:
        for i in range(n):
            image = encode_image((16, 16)) + bytes(image_bytes)  # trailing bytes: a member over a read's chunk
            sink.write({"__key__": f"k{i:03d}", "jpg": image, "cls": str(i % 2).encode()})
    return root


@pytest.mark.parametrize("image_bytes", [0, 3 << 20], ids=["small", "members-past-a-read"])
def test_each_adopted_sample_gets_the_crc32_of_its_span(tmp_path: Path, image_bytes: int) -> None:
    root = _shardwriter(tmp_path / "w", n=12 if not image_bytes else 3, image_bytes=image_bytes)
    adopt_shards(str(root))
    for shard in sorted(root.glob("*.tar")):
        raw = (root / offsets_name(shard.name)).read_bytes()
        assert raw.startswith(b"shardkit-offsets 2 ")
        data = shard.read_bytes()
        for span in load_offsets(raw, where=shard.name):
            assert span.crc32 == zlib.crc32(data[span.offset:span.offset + span.size])


def test_a_label_changed_after_indexing_is_a_corrupt_sample_not_a_wrong_label(tmp_path: Path) -> None:
    root = _shardwriter(tmp_path / "w")
    adopt_shards(str(root))
    shard = root / "w-000000.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b"k000.cls")  # the member's header; its data (the label "0") starts one block on
    start = at - at % 512 + 512
    data_at = data.index(b"0", start)
    data[data_at:data_at + 1] = b"1"
    shard.write_bytes(bytes(data))

    with ShardLoader(str(root), batch_size=4, shuffle=False, drop_last=False, keys=True) as loader:
        seen = {key: int(label) for _, labels, keys in loader for label, key in zip(labels, keys, strict=True)}
        assert loader.stats.replaced == 1
    assert seen.get("k000") is None or seen["k000"] == 0  # replaced by a neighbour, never delivered as label 1
    with ShardLoader(str(root), batch_size=4, shuffle=False, on_error="raise") as loader, \
            pytest.raises(LoaderError, match="k000"):
        list(loader)
    result = CliRunner().invoke(cli, ["verify", str(root)])
    assert result.exit_code == 1 and "k000" in result.output, result.output


def test_indexing_a_pack_again_keeps_its_checksums(tmp_path: Path) -> None:
    """An index --overwrite over a pack wrote version-1 offsets files, dropping every CRC-32."""
    from shardkit.pack import PackOptions, pack
    from tests.conftest import write_tree

    write_tree(tmp_path / "src", {"a/x.jpg": encode_image(), "b/y.jpg": encode_image(), "b/z.jpg": encode_image()})
    pack(str(tmp_path / "src"), str(tmp_path / "p"), options=PackOptions(), workers=1)
    shards = read_manifest(Store(str(tmp_path / "p"))).shards
    before = {s.url: (tmp_path / "p" / offsets_name(s.url)).read_bytes() for s in shards}
    adopt_shards(str(tmp_path / "p"), overwrite=True)
    after = {s.url: (tmp_path / "p" / offsets_name(s.url)).read_bytes() for s in shards}
    assert after == before


def test_an_empty_shard_gets_its_offsets_file_and_verify_says_nothing_of_it(tmp_path: Path) -> None:
    """An empty tar was adopted without an offsets file, and verify then warned of a missing .idx."""
    import tarfile

    root = _shardwriter(tmp_path / "w", n=3)
    with tarfile.open(root / "w-000009.tar", "w"):
        pass
    adopt_shards(str(root))
    assert (root / offsets_name("w-000009.tar")).read_bytes() == b"shardkit-offsets 2 0\n"
    result = CliRunner().invoke(cli, ["verify", str(root)])
    assert result.exit_code == 0 and "WARN" not in result.output, result.output
    with ShardLoader(str(root), batch_size=1, shuffle=False) as loader:
        assert len(list(loader)) == 3


def test_a_shard_without_its_end_of_archive_marker_is_refused_with_the_fix(tmp_path: Path) -> None:
    """GNU tar and webdataset read such a file; the refusal said 'truncated' and nothing more."""
    from shardkit.errors import FormatError

    root = _shardwriter(tmp_path / "w", n=3)
    shard = root / "w-000000.tar"
    data = shard.read_bytes()
    end = len(data.rstrip(b"\0"))
    end += -end % 512
    shard.write_bytes(data[:end])  # the last member's padding kept, every zero block after it cut
    with pytest.raises(FormatError, match="if every sample is there, append the marker, 1,024 zero bytes"):
        adopt_shards(str(root))
    with shard.open("ab") as f:
        f.write(bytes(1024))
    assert adopt_shards(str(root)).num_samples == 3


def test_a_samples_span_is_checksummed_whole_and_read_member_by_member(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A global header between a sample's members is in its span (the CRC-32 covers it), and a sample
    of large members is not held in memory whole while it is checksummed."""
    import io
    import tarfile

    from shardkit.index import _hashing

    members = [("k0.jpg", encode_image((16, 16))), ("k0.bin", bytes(4 << 20)), ("k0.npy", bytes(4 << 20)),
               ("k0.cls", b"1"), ("k1.jpg", encode_image((16, 16))), ("k1.cls", b"0")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    glob = tarfile.TarInfo("pax_global_header")
    glob.type, glob.pax_headers = tarfile.XGLTYPE, {"comment": "between two members of k0"}
    at = raw.index(b"k0.cls") // 512 * 512
    (tmp_path / "a-000000.tar").write_bytes(raw[:at] + glob.tobuf(tarfile.PAX_FORMAT) + raw[at:])

    most = [0]
    real = _hashing.HashingReader.release

    def release(self: _hashing.HashingReader, upto: int) -> None:
        most[0] = max(most[0], sum(len(d) for _, d in self._chunks))
        real(self, upto)

    monkeypatch.setattr(_hashing.HashingReader, "release", release)
    adopt_shards(str(tmp_path))
    data = (tmp_path / "a-000000.tar").read_bytes()
    spans = load_offsets((tmp_path / "a-000000.idx").read_bytes(), where="a")
    assert [s.key for s in spans] == ["k0", "k1"]
    assert all(s.crc32 == zlib.crc32(data[s.offset:s.offset + s.size]) for s in spans)
    assert most[0] < (4 << 20) + (3 << 20)  # one member and the read-ahead, not the sample's 8 MiB
