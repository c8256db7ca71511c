"""The C parser of plain sample spans (``shardkit.format._tarspan``) against the Python parser:
``parse_span`` must answer exactly as ``_parse_span`` does (the same sample, or a FormatError with
the same message) on every span, intact, cut short or damaged."""

from __future__ import annotations

import importlib
import io
import random
import tarfile

import pytest

from shardkit.errors import FormatError
from shardkit.format import TarShardWriter
from shardkit.format.tarread import _parse_span, parse_span, scan_spans


def _answer(read, data: bytes) -> object:
    try:
        return read(data, where="s.tar")
    except FormatError as err:
        return ("FormatError", str(err))


def _ours() -> bytes:
    buf = io.BytesIO()
    w = TarShardWriter(buf)
    w.add("00000001", [("cls", b"3"), ("jpg", b"j" * 1000), ("json", b"{}")])
    w.add("00000002", [("cls", b"14"), ("png", b"p" * 511)])
    w.add("00000003", [("txt", b"")])
    w.close()
    return buf.getvalue()


def _tarfile(fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, size in [("a.cls", 1), ("a.jpg", 700), ("p" * 90 + "/" + "k" * 90 + ".jpg", 512),
                           ("d" * 60 + "/" + "k" * 80 + ".cls", 3)]:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"x" * size))
    return buf.getvalue()


def _spans(data: bytes) -> list[bytes]:
    return [data[o:o + n] for _, o, n in scan_spans(io.BytesIO(data), where="s.tar")]


SHARDS = {"shardkit": _ours(), "ustar": _tarfile(tarfile.USTAR_FORMAT), "gnu": _tarfile(tarfile.GNU_FORMAT),
          "pax": _tarfile(tarfile.PAX_FORMAT)}


def test_the_extension_is_built() -> None:
    # the Makefile and pip install build it; without it every header is parsed in Python
    sample = importlib.import_module("shardkit.format._tarspan").sample
    span = _spans(SHARDS["shardkit"])[0]
    assert sample(span) == ("00000001", {"cls": b"3", "jpg": b"j" * 1000, "json": b"{}"})
    assert sample(memoryview(span)) == sample(span)
    assert sample(b"") is None  # no member: the Python parser names the empty span
    assert sample(span[:100]) is None  # a header cut short: the Python parser says what is wrong


@pytest.mark.parametrize("shard", list(SHARDS))
def test_intact_spans_parse_alike(shard: str) -> None:
    for span in _spans(SHARDS[shard]):
        key, fields = parse_span(span, where="s.tar")  # no error
        assert (key, fields) == _parse_span(span, where="s.tar")


@pytest.mark.parametrize("shard", list(SHARDS))
def test_cut_and_damaged_spans_answer_alike(shard: str) -> None:
    rng = random.Random(shard)
    for span in _spans(SHARDS[shard]):
        for cut in range(0, len(span), 37):
            assert _answer(parse_span, span[:cut]) == _answer(_parse_span, span[:cut])
        for _ in range(400):
            bad = bytearray(span)
            at = rng.randrange(len(bad)) if rng.random() < 0.3 else rng.randrange(min(len(bad), 512))
            bad[at] = rng.randrange(256)
            if rng.random() < 0.3:  # a damaged header whose checksum still matches
                block = at - at % 512
                header = bad[block:block + 512]
                if len(header) == 512:
                    header[148:156] = b" " * 8
                    bad[block + 148:block + 156] = b"%06o\0 " % sum(header)
            assert _answer(parse_span, bytes(bad)) == _answer(_parse_span, bytes(bad)), (shard, at)


def test_special_headers_go_to_the_python_parser() -> None:
    sample = importlib.import_module("shardkit.format._tarspan").sample
    for kind in (b"5", b"x", b"L", b"2", b"1"):  # directory, PAX, GNU long name, symlink, hard link
        span = bytearray(_spans(SHARDS["shardkit"])[0])
        span[156:157] = kind
        span[148:156] = b" " * 8
        span[148:156] = b"%06o\0 " % sum(span[:512])
        assert sample(bytes(span)) is None
        assert _answer(parse_span, bytes(span)) == _answer(_parse_span, bytes(span))


def test_a_buffer_the_c_parser_cannot_take_goes_to_the_python_parser() -> None:
    span = _spans(SHARDS["shardkit"])[0]
    doubled = bytes(b for byte in span for b in (byte, 0))
    strided = memoryview(doubled)[::2]  # not contiguous: the C parser refuses the buffer
    assert parse_span(strided, where="s.tar") == _parse_span(span, where="s.tar")


def _member(name: bytes, data: bytes, prefix: bytes = b"") -> bytes:
    """One plain ustar member with a raw ``name`` (and ``prefix``), checksum right."""
    header = bytearray(512)
    header[:len(name)] = name
    header[100:108] = b"0000644\0"
    header[124:136] = b"%011o\0" % len(data)
    header[156:157] = b"0"
    header[257:263] = b"ustar\0"
    header[345:345 + len(prefix)] = prefix
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + data + bytes(-len(data) % 512)


NAMES = {
    "plain": [(b"k.cls", b""), (b"k.jpg", b"")],
    "directory key": [(b"d/e/k.cls", b""), (b"d/e/k.tar.gz", b"")],
    "prefix joined": [(b"k.cls", b"p/q"), (b"p/q/k.jpg", b"")],
    "dot in a directory": [(b"d.x/k.jpg", b"")],
    "utf-8": [("clé/ß.jpg".encode(), b"")],
    "two keys": [(b"a.cls", b""), (b"b.jpg", b"")],
    "a field twice": [(b"k.jpg", b""), (b"k.jpg", b"")],
    "absolute": [(b"/k.jpg", b"")],
    "dot-dot": [(b"../k.jpg", b"")],
    "dot-dot inside": [(b"d/../k.jpg", b"")],
    "dot-dot prefix": [(b"k.jpg", b"..")],
    "no dot": [(b"k", b"")],
    "no key": [(b".jpg", b"")],
    "no extension": [(b"k.", b"")],
    "no key in a directory": [(b"d/.jpg", b"")],
    "not utf-8 key": [(b"k\xff.jpg", b"")],
    "not utf-8 extension": [(b"k.j\xc3", b"")],
}


@pytest.mark.parametrize("case", list(NAMES))
def test_member_names_answer_as_the_python_parser(case: str) -> None:
    sample = importlib.import_module("shardkit.format._tarspan").sample
    span = b"".join(_member(name, b"x" * i, prefix) for i, (name, prefix) in enumerate(NAMES[case]))
    python = _answer(_parse_span, span)
    assert _answer(parse_span, span) == python
    # the C parser answers exactly where the Python one accepts the span; an error is left to it
    assert sample(span) == (None if isinstance(python, tuple) and python[0] == "FormatError" else python)


@pytest.mark.parametrize("shard", list(SHARDS))
def test_members_are_where_sample_copies_them_from(shard: str) -> None:
    module = importlib.import_module("shardkit.format._tarspan")
    for span in _spans(SHARDS[shard]):
        copied, placed = module.sample(span), module.members(span)
        assert (copied is None) == (placed is None)
        if copied is not None:
            assert placed[0] == copied[0]
            assert {ext: span[s:s + n] for ext, (s, n) in placed[1].items()} == copied[1]
        for cut in range(0, len(span), 211):  # cut short: the same answer (None, or the members before the cut)
            short = module.sample(span[:cut])
            got = module.members(span[:cut])
            assert (short is None) == (got is None)
            if got is not None:
                assert {ext: span[s:s + n] for ext, (s, n) in got[1].items()} == short[1]


@pytest.mark.parametrize("case", list(NAMES))
def test_members_answer_where_sample_does(case: str) -> None:
    module = importlib.import_module("shardkit.format._tarspan")
    span = b"".join(_member(name, b"x" * i, prefix) for i, (name, prefix) in enumerate(NAMES[case]))
    copied, placed = module.sample(span), module.members(span)
    assert (copied is None) == (placed is None)
    if copied is not None:
        assert (placed[0], {ext: span[s:s + n] for ext, (s, n) in placed[1].items()}) == copied
