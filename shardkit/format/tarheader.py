"""One tar header block, read strictly: its numbers (octal or GNU base-256), its checksum, its
name and size, and the PAX records of an extended header. Every malformed field raises
``FormatError`` naming where it is; :mod:`shardkit.format.tarread` walks a stream of them."""

from __future__ import annotations

from shardkit.errors import FormatError

__all__ = ["BLOCK", "checksum", "header", "is_header", "not_tar", "number", "pax_records", "pax_size", "text_field"]

BLOCK = 512
#: Digits in a PAX ``size`` record beyond which it is refused unread (any real size has fewer).
_MAX_SIZE_DIGITS = 20


def number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 (high bit of the first byte set)."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value if field[:1] == b"\x80" else value - (1 << (8 * (len(field) - 1)))
    text = field.rstrip(b" \0").lstrip(b" ")  # strict: nothing but NUL/space around the digits
    if not text:
        return 0
    if text.translate(None, b"01234567"):  # anything but octal digits left
        raise ValueError(text)
    return int(text, 8)


def text_field(field: bytes, what: str, where: str) -> str:
    try:
        return field.split(b"\0", 1)[0].decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"{what} is not valid UTF-8 ({err.reason} at byte {err.start})",
                          where=where) from err


def pax_records(data: bytes, where: str) -> dict[str, str]:
    """Parse PAX extended header records ``"<len> <key>=<value>\\n"``."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        record = data[pos:pos + length]
        if length <= 0 or len(record) != length or not record.endswith(b"\n") or b"=" not in record:
            raise FormatError(f"malformed PAX record at byte {pos} of the extended header",
                              where=where)
        key, _, value = record[space - pos + 1:-1].partition(b"=")
        try:
            records[key.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise FormatError(f"PAX record {key!r} is not valid UTF-8", where=where) from err
        pos += length
    return records


def pax_size(text: str, name: str, where: str) -> int:
    """A PAX ``size`` record: ASCII decimal digits only (``str.isdigit`` also takes ``'²'``), and
    few enough of them to be a size at all (a 5,000-digit number is not, and ``int`` refuses it)."""
    if not text.isascii() or not text.isdigit() or len(text) > _MAX_SIZE_DIGITS:
        shown = repr(text[:20]) + ("..." if len(text) > 20 else "")
        raise FormatError(f"member {name!r} has a malformed PAX size {shown} ({len(text)} characters)",
                          where=where)
    return int(text)


def is_header(block: bytes) -> bool:
    """Whether ``block`` (the first of a file, perhaps cut short) looks like a tar header: the
    ustar magic (then however damaged its other fields), or a right checksum (old-style headers
    have no magic). What tells a tar file that went wrong from a file that is no tar at all."""
    if block[257:262] == b"ustar":
        return True
    if len(block) < BLOCK:
        return False
    try:
        stored = number(block[148:156])
    except ValueError:
        return False
    return stored == checksum(block)


def checksum(block: bytes) -> int:
    """A header's checksum as it should be: its bytes summed, the checksum field as spaces."""
    return sum(block) - sum(block[148:156]) + 8 * 32


def not_tar(block: bytes) -> str:
    """Why a file whose first block is no tar header is not a tar file, in words."""
    if block[:2] == b"\x1f\x8b":
        return "not a tar file: gzip-compressed (decompress it; shards are plain tar files)"
    if len(block) < BLOCK:
        return f"not a tar file ({len(block)} bytes, less than one 512-byte tar header)"
    return "not a tar file (its first 512 bytes are no tar header)"


def header(block: bytes, where: str) -> tuple[str, int, bytes]:
    """Validate one 512-byte header; return ``(name, size, type)``. ``where`` names the offset."""
    try:
        stored = number(block[148:156])
    except ValueError as err:
        raise FormatError("corrupt tar header (checksum field is not a number)",
                          where=where) from err
    computed = checksum(block)
    if stored != computed:
        raise FormatError(f"corrupt tar header (checksum {stored} != computed {computed})",
                          where=where)
    name = text_field(block[:100], "member name", where)
    if block[257:262] == b"ustar":
        prefix = text_field(block[345:500], "member name prefix", where)
        name = f"{prefix}/{name}" if prefix else name
    try:
        size = number(block[124:136])
    except ValueError as err:
        raise FormatError(f"member {name!r} has a corrupt size field", where=where) from err
    if size < 0:
        raise FormatError(f"member {name!r} has a negative size", where=where)
    return name, size, block[156:157]
