import hashlib
import io
import subprocess
import tarfile
import zlib

import pytest

from shardkit.errors import FormatError
from shardkit.format import TarShardWriter, dump_offsets, iter_samples, load_offsets, parse_span
from shardkit.format.tarwrite import SampleSpan

SAMPLES = [
    ("00000000", [("jpg", b"\xff\xd8jpeg\xff\xd9"), ("cls", b"3"), ("json", b'{"a":1}')]),
    ("00000001", [("json", b"{}"), ("png", b"x" * 1000), ("cls", b"0")]),
    ("00000002", [("cls", b"1"), ("jpg", b"")]),
]


def _write(samples=SAMPLES):
    buf = io.BytesIO()
    writer = TarShardWriter(buf)
    for key, fields in samples:
        writer.add(key, fields)
    summary = writer.close()
    return buf.getvalue(), summary


def test_reproducible_and_summarised():
    data, summary = _write()
    assert _write()[0] == data
    assert summary.num_samples == 3
    assert summary.num_bytes == len(data)
    assert len(data) % 10240 == 0  # padded to whole records like GNU tar
    assert summary.sha256 == hashlib.sha256(data).hexdigest()


def test_header_conventions():
    data, _ = _write()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "00000000.cls", "00000000.jpg", "00000000.json",
        "00000001.cls", "00000001.json", "00000001.png",
        "00000002.cls", "00000002.jpg",
    ]
    for m in members:
        assert (m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname) == (0, 0o444, 0, 0, "", "")
        assert m.isreg()
    assert data[257:263] == b"ustar\x00"  # POSIX ustar headers


def test_gnu_tar_reads_it(tmp_path):
    data, _ = _write()
    path = tmp_path / "x-000000.tar"
    path.write_bytes(data)
    listed = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
    assert (listed.stdout.split()
            == [f"{k}.{e}" for k, fs in SAMPLES for e in sorted(f[0] for f in fs)])


def test_iter_samples_and_spans_round_trip():
    data, summary = _write()
    read = list(iter_samples(io.BytesIO(data), where="x"))
    assert [k for k, _ in read] == [k for k, _ in SAMPLES]
    for (key, fields), (_, expected) in zip(read, SAMPLES, strict=True):
        assert fields == dict(expected)
        span = next(s for s in summary.spans if s.key == key)
        assert (parse_span(data[span.offset : span.offset + span.size], where="x")
                == (key, dict(expected)))
    assert load_offsets(dump_offsets(summary.spans), where="x.idx") == summary.spans


def test_offsets_file_text_format():
    """Version 2: each sample's CRC-32 (of its span's bytes) as 8 hex digits; version 1 without."""
    data, summary = _write()
    text = dump_offsets(summary.spans).decode()
    lines = text.splitlines()
    assert lines[0] == "shardkit-offsets 2 3"
    assert lines[1] == f"00000000 0 3072 {zlib.crc32(data[:3072]):08x}"
    for span in summary.spans:
        assert span.crc32 == zlib.crc32(data[span.offset : span.offset + span.size])
    plain = [SampleSpan(s.key, s.offset, s.size) for s in summary.spans]  # no CRC known: version 1
    assert dump_offsets(plain).decode().splitlines()[:2] == ["shardkit-offsets 1 3", "00000000 0 3072"]
    assert load_offsets(dump_offsets(plain), where="x.idx") == plain


@pytest.mark.parametrize("bad", [b"", b"\xff\xfe", b"other 1 0\n", b"shardkit-offsets 3 0\n",
                                 b"shardkit-offsets 1 2\nk 0 10\n",
                                 b"shardkit-offsets 1 1\nk zero 10\n",
                                 b"shardkit-offsets 1 1\nk 0 512 0a0b0c0d\n",
                                 b"shardkit-offsets 2 1\nk 0 512\n",
                                 b"shardkit-offsets 2 1\nk 0 512 0A0B0C0D\n",
                                 b"shardkit-offsets 2 1\nk 0 512 abc\n"])
def test_malformed_offsets_files(bad):
    with pytest.raises(FormatError, match="x.idx"):
        load_offsets(bad, where="x.idx")


@pytest.mark.parametrize(("bad", "message"), [
    (b"shardkit-offsets 1 many\nk 0 10\n", "malformed sample count 'many'"),
    (b"shardkit-offsets 1 1\nk -5 10\n", "negative offset or size on line 2"),
    (b"shardkit-offsets 1 1\nk 0 -10\n", "negative offset or size on line 2"),
])
def test_offsets_header_count_and_negative_spans(bad, message):
    with pytest.raises(FormatError, match=message):
        load_offsets(bad, where="x.idx")


def test_writer_refuses_bad_keys_and_use_after_close():
    writer = TarShardWriter(io.BytesIO())
    with pytest.raises(FormatError):
        writer.add("a.b", [("jpg", b"")])
    writer.close()
    with pytest.raises(ValueError):
        writer.add("k", [("jpg", b"")])


def test_parse_span_rejects_mixed_or_empty_spans():
    data, _ = _write()
    with pytest.raises(FormatError, match="mixes"):
        parse_span(data[: 3072 + 1024], where="x")
    with pytest.raises(FormatError, match="empty"):
        parse_span(bytes(1024), where="x")
    with pytest.raises(FormatError, match="truncated"):
        parse_span(data[3072 : 3072 + 2048 + 512 + 500], where="x")


@pytest.mark.parametrize("name", ["00000000.jpg", "k.json", "a" * 99, "a" * 100,
                                  "x" * 150 + "/y.jpg", "é.jpg"])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 10**9, 8**11 - 1])
def test_fast_header_equals_tarfiles(name, size):
    from shardkit.format.tarwrite import _tarfile_header, ustar_header

    assert ustar_header(name, size) == _tarfile_header(name, size)
    assert len(ustar_header(name, size)) == 512
