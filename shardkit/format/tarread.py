"""Safe tar reading: regular members only, grouped into samples by key.

Two ways in: :func:`iter_samples` streams a whole shard (sequential reads, any file object);
:func:`parse_span` parses one sample's bytes read at a known offset (random access).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from shardkit.errors import FormatError
from shardkit.format.spec import split_member

BLOCK = 512
#: Members larger than this are refused (a corrupt size field must not make us allocate GBs).
MAX_MEMBER_BYTES = 1 << 30

Sample = dict[str, bytes]
"""A sample as read: ``{"__key__": key (as bytes-free str), ext: data, ...}``; see iter_samples."""


def _check_name(name: str, where: str) -> None:
    if name.startswith("/") or ".." in name.split("/"):
        raise FormatError(f"unsafe member name {name!r} (absolute or '..')", where=where)


def iter_members(fileobj: BinaryIO, *, where: str) -> Iterator[tuple[str, bytes]]:
    """Yield ``(name, data)`` of each regular member of a tar stream, in order.

    Raises:
        FormatError: the stream is not a tar file, is truncated, or holds a link, device,
            absolute or ``..`` path, or an oversized member. ``where`` names the shard.
    """
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for info in tar:
                _check_name(info.name, where)
                if info.isdir():
                    continue
                if not info.isreg():
                    raise FormatError(f"member {info.name!r} is not a regular file", where=where)
                if info.size > MAX_MEMBER_BYTES:
                    raise FormatError(f"member {info.name!r} is too large ({info.size} bytes)", where=where)
                handle = tar.extractfile(info)
                if handle is None:  # pragma: no cover - regular members always have data
                    raise FormatError(f"member {info.name!r} has no data", where=where)
                data = handle.read()
                if len(data) != info.size:
                    raise FormatError(f"member {info.name!r} is truncated", where=where)
                yield info.name, data
    except tarfile.TarError as err:
        raise FormatError(f"not a readable tar file ({err})", where=where) from err
    except EOFError as err:
        raise FormatError("tar file is truncated", where=where) from err


def iter_samples(fileobj: BinaryIO, *, where: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield ``(key, {ext: data})`` per sample: consecutive members sharing a key.

    Raises:
        FormatError: as :func:`iter_members`, or a key appears in two separate runs or a
            sample has the same field twice.
    """
    seen: set[str] = set()
    key: str | None = None
    fields: dict[str, bytes] = {}
    for name, data in iter_members(fileobj, where=where):
        base = name.rsplit("/", 1)[-1]
        member_key, ext = split_member(base, where=f"{where}:{name}")
        member_key = name[: len(name) - len(base)] + member_key
        if member_key != key:
            if key is not None:
                yield key, fields
            if member_key in seen:
                raise FormatError(f"sample {member_key!r} is split across the shard", where=where)
            seen.add(member_key)
            key, fields = member_key, {}
        if ext in fields:
            raise FormatError(f"sample {member_key!r} has field {ext!r} twice", where=where)
        fields[ext] = data
    if key is not None:
        yield key, fields


def _octal(field: bytes) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    return int(text, 8) if text else 0


def parse_span(data: bytes | memoryview, *, where: str) -> tuple[str, dict[str, bytes]]:
    """Parse one sample's members from its bytes (a span recorded in the offsets file).

    Returns ``(key, {ext: data})``. Raises ``FormatError`` on anything but regular ustar
    members of a single key.
    """
    view = memoryview(data)
    pos, key, fields = 0, "", {}
    while pos + BLOCK <= len(view):
        header = bytes(view[pos : pos + BLOCK])
        if header == bytes(BLOCK):
            break
        name = header[:100].rstrip(b"\0").decode("utf-8", "strict")
        prefix = header[345:500].rstrip(b"\0").decode("utf-8", "strict")
        if prefix:
            name = f"{prefix}/{name}"
        if header[156:157] not in (b"0", b"\0"):
            raise FormatError(f"member {name!r} is not a regular file", where=where)
        _check_name(name, where)
        try:
            size = _octal(header[124:136])
        except ValueError as err:
            raise FormatError(f"member {name!r} has a corrupt header", where=where) from err
        member_key, ext = split_member(name, where=where)
        if key and member_key != key:
            raise FormatError(f"span mixes samples {key!r} and {member_key!r}", where=where)
        key = member_key
        start = pos + BLOCK
        if start + size > len(view):
            raise FormatError(f"member {name!r} is truncated", where=where)
        fields[ext] = bytes(view[start : start + size])
        pos = start + size + (-size % BLOCK)
    if not key:
        raise FormatError("empty sample span", where=where)
    return key, fields


def scan_spans(fileobj: BinaryIO, *, where: str) -> list[tuple[str, int, int]]:
    """Find each sample's ``(key, offset, size)`` by reading only the tar headers (seeking past
    the data). Used when a shard has no offsets file.
    """
    spans: list[tuple[str, int, int]] = []
    pos = 0
    while True:
        fileobj.seek(pos)
        header = fileobj.read(BLOCK)
        if len(header) < BLOCK:
            raise FormatError("tar file is truncated (no end-of-archive marker)", where=where)
        if header == bytes(BLOCK):
            return spans
        name = header[:100].rstrip(b"\0").decode("utf-8", "replace")
        try:
            size = _octal(header[124:136])
        except ValueError as err:
            raise FormatError(f"corrupt header at byte {pos}", where=where) from err
        key, _ = split_member(name.rsplit("/", 1)[-1], where=where)
        end = pos + BLOCK + size + (-size % BLOCK)
        if spans and spans[-1][0] == key:
            k, start, _ = spans[-1]
            spans[-1] = (k, start, end - start)
        else:
            spans.append((key, pos, end - pos))
        pos = end
