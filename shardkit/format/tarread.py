"""Safe tar reading: regular members only, grouped into samples by key.

One header parser serves every way in: :func:`iter_entries` walks a tar stream member by member
(ustar headers, plus the PAX ``x``/``g`` and GNU ``L`` extension headers that Python's
``tarfile``, GNU tar and webdataset's ``ShardWriter`` write); :func:`iter_samples` groups a whole
shard into samples; :func:`scan_spans` finds each sample's byte span by seeking past the data;
:func:`parse_span` parses one sample's bytes read at a known offset (random access).

Every safety rule applies to the *effective* name and size (after extension headers): regular
files only (directories are skipped), no absolute or ``..`` names, no links or devices, members
and extension headers bounded in size. A malformed header (bad checksum, undecodable name, bad
size, malformed PAX record) raises ``FormatError`` naming the shard and the header's byte offset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from shardkit.errors import FormatError
from shardkit.format.spec import check_member_name, split_member
from shardkit.format.tarheader import BLOCK, header, is_header, not_tar, pax_records, pax_size, text_field
from shardkit.format.tarspan import plain_sample

#: Members larger than this are refused (a corrupt size field must not make us allocate GBs).
MAX_MEMBER_BYTES = 1 << 30
#: PAX and GNU long-name headers larger than this are refused (real ones are a few hundred bytes).
MAX_EXTENSION_BYTES = 1 << 20

_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # 7: contiguous file, a regular file to every reader
_DIRECTORY = b"5"
_PAX, _PAX_GLOBAL, _GNU_LONGNAME = b"x", b"g", b"L"

Sample = dict[str, bytes]
"""A sample's fields as read: ``{ext: data}``."""


class TarEntry(NamedTuple):
    """One regular member: effective ``name``, ``offset`` of its first header (extension headers
    included), ``data_offset`` and ``size`` of its data, and the data when it was read.
    (A tuple, not a frozen dataclass: one is built per member on the loader's hot path.)"""

    name: str
    offset: int
    data_offset: int
    size: int
    data: bytes | None

    @property
    def end(self) -> int:
        """Offset just past the member's data padding (where the next header starts)."""
        return self.data_offset + self.size + (-self.size % BLOCK)


class _Reader:
    """Sequential reads with a position; ``skip`` seeks when the file can, else reads."""

    def __init__(self, fileobj: BinaryIO, *, seek: bool) -> None:
        self._file = fileobj
        self._seek = seek
        self.pos = 0

    def read(self, n: int) -> bytes:
        chunks, want = [], n
        while want:
            chunk = self._file.read(want)
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
        data = b"".join(chunks)
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        if self._seek:
            self._file.seek(self.pos + n)
            self.pos += n
            return n
        done = 0
        while done < n:
            got = len(self.read(min(n - done, 1 << 20)))
            if not got:
                break
            done += got
        return done


class _ViewReader(_Reader):
    """The same reads over bytes already in memory (a sample span): slices, no file calls."""

    def __init__(self, data: bytes | memoryview) -> None:  # noqa: D107 - no file behind it
        self._view = memoryview(data)
        self.pos = 0

    def read(self, n: int) -> bytes:
        data = bytes(self._view[self.pos:self.pos + n])
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        done = max(0, min(n, len(self._view) - self.pos))
        self.pos += done
        return done


def _walk(reader: _Reader, *, where: str, read_data: bool,
          eof_ends: bool = False) -> Iterator[TarEntry]:
    global_pax: dict[str, str] = {}
    pending: dict[str, str] = {}
    first = -1  # offset of the first header of the member being assembled
    while True:
        start = reader.pos
        block = reader.read(BLOCK)
        if not block and eof_ends and first < 0:
            return
        if start == 0 and not eof_ends and block != _ZERO_BLOCK and not is_header(block):
            raise FormatError(not_tar(block), where=where)
        if len(block) < BLOCK:
            if block:
                raise FormatError(f"tar file is truncated (it ends inside a header at byte {start})", where=where)
            if eof_ends:  # a span, read by its offsets, ends after extension headers: no hint of zero bytes
                raise FormatError(f"extension header at byte {first} is not followed by a member", where=where)
            raise FormatError(f"tar file is truncated (it has no end-of-archive marker at byte {start}: its writer "
                              "stopped before closing it, or it was cut at a member's end; if every sample is there, "
                              "append the marker, 1,024 zero bytes: head -c 1024 /dev/zero >> SHARD)", where=where)
        if block == _ZERO_BLOCK:
            if pending or first >= 0:
                raise FormatError(f"extension header at byte {first} is not followed by a member",
                                  where=where)
            return
        here = f"{where}: byte {start}"
        raw_name, size, kind = header(block, here)
        first = start if first < 0 else first
        if kind in (_PAX, _PAX_GLOBAL, _GNU_LONGNAME):
            if size > MAX_EXTENSION_BYTES:
                raise FormatError(f"extension header is too large ({size} bytes)", where=here)
            extension = reader.read(size)
            if len(extension) < size:
                raise FormatError("tar file is truncated (inside an extension header)", where=here)
            reader.skip(-size % BLOCK)
            if kind == _PAX:
                pending.update(pax_records(extension, here))
            elif kind == _PAX_GLOBAL:
                global_pax.update(pax_records(extension, here))
                first = -1
            else:
                pending["path"] = text_field(extension, "GNU long name", here)
            continue
        fields = {**global_pax, **pending}
        pending = {}
        name = fields.get("path", raw_name)
        if "size" in fields:
            size = pax_size(fields["size"], name, here)
        offset, first = first, -1
        check_member_name(name, where=here)
        if kind == _DIRECTORY:
            reader.skip(size + (-size % BLOCK))
            continue
        if kind not in _REGULAR:
            link = {b"1": "a hard link", b"2": "a symbolic link"}.get(kind)
            raise FormatError(f"member {name!r} is not a regular file (type {kind!r}"
                              + (f": {link}, whose bytes the shard does not hold; write the shard with tar's "
                                 "--dereference --hard-dereference to store the files themselves)" if link else ")"),
                              where=here)
        if size > MAX_MEMBER_BYTES:
            raise FormatError(f"member {name!r} is too large ({size} bytes)", where=here)
        data_offset = reader.pos
        if read_data:
            data: bytes | None = reader.read(size)
            got = len(data or b"")
        else:
            data, got = None, reader.skip(size)
        if got < size:
            raise FormatError(f"member {name!r} is truncated", where=here)
        reader.skip(-size % BLOCK)
        yield TarEntry(name, offset, data_offset, size, data)


def iter_entries(fileobj: BinaryIO, *, where: str, read_data: bool = True,
                 seekable: bool = False) -> Iterator[TarEntry]:
    """Yield each regular member of a tar stream as a :class:`TarEntry`, in order.

    ``read_data=False`` skips the data (seeking past it when ``seekable``). Stops at the first
    end-of-archive block.

    Raises:
        FormatError: a header is malformed (names the byte offset), the stream is truncated or
            lacks the end-of-archive marker, or a member is a link, device, absolute or ``..``
            path, or oversized. ``where`` names the shard.
    """
    return _walk(_Reader(fileobj, seek=seekable), where=where, read_data=read_data)


def iter_members(fileobj: BinaryIO, *, where: str) -> Iterator[tuple[str, bytes]]:
    """Yield ``(name, data)`` of each regular member of a tar stream, in order.

    Raises:
        FormatError: as :func:`iter_entries`.
    """
    for entry in iter_entries(fileobj, where=where):
        yield entry.name, entry.data or b""


def sample_key(name: str, *, where: str) -> tuple[str, str]:
    """``(key, ext)`` of a member name: the directory part stays in the key, the base name is
    split at its first dot (webdataset's and DALI's rule).

    >>> sample_key("train/0001.seg.png", where="s")
    ('train/0001', 'seg.png')
    """
    base = name.rsplit("/", 1)[-1]
    key, ext = split_member(base, where=f"{where}:{name}")
    return name[: len(name) - len(base)] + key, ext


def iter_samples(fileobj: BinaryIO, *, where: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield ``(key, {ext: data})`` per sample: consecutive members sharing a key.

    Raises:
        FormatError: as :func:`iter_entries`, or a key appears in two separate runs or a
            sample has the same field twice.
    """
    seen: set[str] = set()
    key: str | None = None
    fields: dict[str, bytes] = {}
    for name, data in iter_members(fileobj, where=where):
        member_key, ext = sample_key(name, where=where)
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


def parse_span(data: bytes | memoryview, *, where: str) -> tuple[str, dict[str, bytes]]:
    """Parse one sample's members from its bytes (a span recorded in the offsets file).

    Returns ``(key, {ext: data})``. Raises ``FormatError`` on anything but regular members
    (with their extension headers) of a single key.

    Plain ustar headers are read by the C extension ``_tarspan`` where it is built
    (:func:`~shardkit.format.tarspan.plain_sample`: the loader's every sample comes through here);
    anything it does not take, an error included, is parsed again by the Python parser below,
    which has the full rules and the messages.
    """
    sample = plain_sample(data)
    return sample if sample is not None else _parse_span(data, where=where)


def _parse_span(data: bytes | memoryview, *, where: str) -> tuple[str, dict[str, bytes]]:
    reader = _ViewReader(data)
    key, fields = "", {}
    for entry in _walk(reader, where=where, read_data=True, eof_ends=True):
        member_key, ext = sample_key(entry.name, where=where)
        if key and member_key != key:
            raise FormatError(f"span mixes samples {key!r} and {member_key!r}", where=where)
        if ext in fields:
            raise FormatError(f"sample {member_key!r} has field {ext!r} twice", where=where)
        key = member_key
        fields[ext] = entry.data or b""
    if not key:
        raise FormatError("empty sample span", where=where)
    return key, fields


def group_spans(entries: Iterator[TarEntry], *, where: str) -> list[tuple[str, int, int]]:
    """Group consecutive entries by key into ``(key, offset, size)`` sample spans.

    Raises ``FormatError`` when a key appears in two separate runs.
    """
    spans: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for entry in entries:
        key, _ = sample_key(entry.name, where=where)
        if spans and spans[-1][0] == key:
            spans[-1] = (key, spans[-1][1], entry.end - spans[-1][1])
            continue
        if key in seen:
            raise FormatError(f"sample {key!r} is split across the shard", where=where)
        seen.add(key)
        spans.append((key, entry.offset, entry.end - entry.offset))
    return spans


def scan_spans(fileobj: BinaryIO, *, where: str) -> list[tuple[str, int, int]]:
    """Find each sample's ``(key, offset, size)`` by reading only the tar headers (seeking past
    the data). Used when a shard has no offsets file.
    """
    return group_spans(iter_entries(fileobj, where=where, read_data=False, seekable=True),
                       where=where)
