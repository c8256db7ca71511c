"""Shards from other writers (tarfile PAX/GNU, GNU tar, webdataset's ShardWriter) and corrupt
headers."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from shardkit.errors import FormatError
from shardkit.format import TarShardWriter, iter_samples, parse_span
from shardkit.format.tarread import BLOCK, iter_entries, scan_spans

LONG = "d" * 60 + "/" + "k" * 120  # > 100 bytes: needs a PAX path or a GNU long name


def _tarfile_shard(fmt: int, names: list[str], payload: bytes = b"x" * 700) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            # a float mtime: tarfile writes a PAX header (as webdataset does)
            info.mtime = 1700000000.5
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_pax_and_gnu_shards_read_with_long_names(fmt: int) -> None:
    names = ["a.cls", "a.jpg", f"{LONG}.cls", f"{LONG}.png", "b.cls"]
    data = _tarfile_shard(fmt, names)
    got = list(iter_samples(io.BytesIO(data), where="s.tar"))
    assert ([(k, sorted(f)) for k, f in got]
            == [("a", ["cls", "jpg"]), (LONG, ["cls", "png"]), ("b", ["cls"])])
    assert all(v == b"x" * 700 for _, f in got for v in f.values())
    spans = scan_spans(io.BytesIO(data), where="s.tar")
    assert [k for k, _, _ in spans] == ["a", LONG, "b"]
    for key, offset, size in spans:  # each span parses alone, extension headers included
        assert parse_span(data[offset:offset + size], where="s.tar")[0] == key
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # offsets agree with tarfile's own
        expected = [(m.name, m.offset_data, m.size) for m in tar]
    assert ([(e.name, e.data_offset, e.size) for e in iter_entries(io.BytesIO(data), where="s")]
            == expected)


def test_gnu_tar_shard(tmp_path: Path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("no tar binary")
    src = tmp_path / "src"
    (src / ("d" * 60)).mkdir(parents=True)
    (src / f"{LONG}.jpg").write_bytes(b"img")
    (src / f"{LONG}.cls").write_bytes(b"1")
    out = tmp_path / "gnu.tar"
    subprocess.run(["tar", "--format=gnu", "--sort=name", "-cf", str(out), "-C", str(src), "."],
                   check=True)
    samples = list(iter_samples(out.open("rb"), where="gnu.tar"))
    assert samples == [(f"./{LONG}", {"cls": b"1", "jpg": b"img"})]


def test_webdataset_shardwriter_shard(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=100) as sink:
        for i in range(5):
            sink.write({"__key__": f"s{i:04d}", "jpg": b"J" * (100 + i),
                        "cls": str(i % 2).encode()})
    data = (tmp_path / "wds-000000.tar").read_bytes()
    assert b"PaxHeader" in data  # webdataset writes a PAX header per member
    got = list(iter_samples(io.BytesIO(data), where="w.tar"))
    assert [k for k, _ in got] == [f"s{i:04d}" for i in range(5)]
    assert [f["cls"] for _, f in got] == [b"0", b"1", b"0", b"1", b"0"]
    assert [len(f["jpg"]) for _, f in got] == [100, 101, 102, 103, 104]


def _rec(key: str, value: bytes) -> bytes:
    body = b" " + key.encode() + b"=" + value + b"\n"
    n = len(body) + 1
    n += len(str(n + len(str(n)) - 1)) - 1
    return str(n).encode() + body


def _pax_with(records: bytes) -> bytes:
    """A tar whose first member has a hand-written PAX header."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = len(records)
    body = tarfile.TarInfo("k.jpg")
    body.size = 3
    out = info.tobuf(tarfile.USTAR_FORMAT) + records + bytes(-len(records) % BLOCK)
    return out + body.tobuf(tarfile.USTAR_FORMAT) + b"abc" + bytes(BLOCK - 3) + bytes(2 * BLOCK)


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (_rec("path", b"../evil.jpg"), "unsafe"),
        (_rec("path", b"/etc.jpg"), "unsafe"),
        (_rec("size", b"9x9"), "malformed PAX size"),
        (b"99 path=x.jpg\n", "malformed PAX record"),
        (b"garbage\n", "malformed PAX record"),
        (_rec("path", b"\xff.jpg"), "not valid UTF-8"),
        (_rec("size", b"99999999"), "truncated"),
    ],
)
def test_bad_pax_headers(records: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message) as err:
        list(iter_samples(io.BytesIO(_pax_with(records)), where="p.tar"))
    assert "p.tar" in str(err.value)


def test_pax_path_applies_to_following_member() -> None:
    assert (list(iter_samples(io.BytesIO(_pax_with(_rec("path", b"z.png"))), where="p"))
            == [("z", {"png": b"abc"})])


def _our_shard() -> bytes:
    buf = io.BytesIO()
    w = TarShardWriter(buf)
    w.add("00000001", [("cls", b"3"), ("jpg", b"j" * 1000)])
    w.add("00000002", [("cls", b"4"), ("png", b"p" * 10)])
    w.close()
    return buf.getvalue()


@pytest.mark.parametrize("header_at", [0, 1024, 2560])  # each of the first three headers
def test_every_bit_flip_in_a_header_is_a_format_error(header_at: int) -> None:
    data = _our_shard()
    span = next((o, n) for _, o, n in scan_spans(io.BytesIO(data), where="f.tar")
                if o <= header_at < o + n)
    readers = (
        lambda b: list(iter_samples(io.BytesIO(b), where="f.tar")),
        lambda b: scan_spans(io.BytesIO(b), where="f.tar"),
        lambda b: parse_span(b[span[0]:span[0] + span[1]], where="f.tar"),
    )
    for read in readers:
        read(data)  # the intact shard reads
    for byte in range(header_at, header_at + BLOCK):
        for bit in (0, 7):
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            for read in readers:
                try:
                    read(bytes(bad))
                except FormatError as err:
                    assert "f.tar" in str(err)
                else:  # the checksum covers every header byte, and its own field is parsed strictly
                    pytest.fail(f"flip of bit {bit} at byte {byte} went unnoticed")


def test_bit_flip_message_names_offset() -> None:
    bad = bytearray(_our_shard())
    bad[1024 + 3] ^= 0x80  # the second header's name: invalid UTF-8 and a wrong checksum
    with pytest.raises(FormatError, match=r"f\.tar: byte 1024: corrupt tar header"):
        list(iter_samples(io.BytesIO(bytes(bad)), where="f.tar"))


def test_truncated_inside_extension_header_and_missing_member() -> None:
    data = _pax_with(_rec("path", b"z.png"))
    with pytest.raises(FormatError, match="truncated"):
        list(iter_samples(io.BytesIO(data[:600]), where="t"))
    with pytest.raises(FormatError, match="not followed by a member"):
        list(iter_samples(io.BytesIO(data[:1024] + bytes(2 * BLOCK)), where="t"))
