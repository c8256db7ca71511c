"""One sample span's members through the C extension ``_tarspan`` (``_tarspan.c``): the fast path
of :func:`~shardkit.format.tarread.parse_span`, taken for spans of plain ustar headers of
regular files, which is every span shardkit writes.

:func:`plain_sample` answers only when it is sure: the sample, by the Python parser's rules on
names and keys, or None for anything else (extension headers, a damaged header, a span the C
extension cannot read, no extension built), and the caller then parses the span with the full
rules, which name any error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from shardkit.errors import FormatError
from shardkit.format.spec import check_member_name, split_member

__all__ = ["plain_sample"]

#: ``_tarspan.members``, or None where the C extension is not built.
_members: Callable[[bytes | memoryview], list[tuple[bytes, int, int]] | None] | None
try:
    _members = importlib.import_module("shardkit.format._tarspan").members
except ImportError:  # not built: the Python parser reads every header
    _members = None


def plain_sample(data: bytes | memoryview) -> tuple[str, dict[str, bytes]] | None:
    """``(key, {ext: data})`` of a span of plain members of one sample, else None (see the module)."""
    try:
        plain = _members(data) if _members is not None else None
    except (BufferError, TypeError):  # e.g. a memoryview that is not contiguous
        return None
    if plain is None:
        return None
    try:
        return _sample_of(data, plain)
    except (FormatError, UnicodeDecodeError):
        return None


def _sample_of(data: bytes | memoryview, plain: list[tuple[bytes, int, int]]) -> tuple[str, dict[str, bytes]]:
    """The sample of the members ``_tarspan`` listed, by ``tarread._parse_span``'s rules on names
    and keys."""
    buf = data if isinstance(data, bytes) else memoryview(data)
    key, fields = "", {}
    for raw, start, size in plain:
        name = raw.decode("utf-8")
        check_member_name(name)
        slash = name.rfind("/") + 1
        stem, ext = split_member(name[slash:])  # sample_key's rule, without its error text per member
        member_key = name[:slash] + stem
        if (key and member_key != key) or ext in fields:
            raise FormatError("not one sample")
        key = member_key
        fields[ext] = bytes(buf[start:start + size])
    if not key:
        raise FormatError("empty sample span")
    return key, fields
