"""One sample span's members through the C extension ``_tarspan`` (``_tarspan.c``): the fast path
of :func:`~shardkit.format.tarread.parse_span`, taken for spans of plain ustar headers of
regular files named ``<key>.<ext>``, which is every span shardkit writes.

:func:`plain_sample` answers only when it is sure: the sample, by the Python parser's rules on
names and keys, or None for anything else (extension headers, a damaged header, a name the
Python parser would refuse, a span the C extension cannot read, no extension built), and the
caller then parses the span with the full rules, which name any error. :func:`plain_members`
answers the same, with where each member lies in the span instead of a copy of its bytes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

__all__ = ["plain_members", "plain_sample"]

#: ``_tarspan.sample`` and ``_tarspan.members``, or None where the C extension is not built.
_sample: Callable[[bytes | memoryview], tuple[str, dict[str, bytes]] | None] | None
_members: Callable[[bytes | memoryview], tuple[str, dict[str, tuple[int, int]]] | None] | None
_module: ModuleType | None
try:
    _module = importlib.import_module("shardkit.format._tarspan")
except ImportError:  # not built: Python parses every span
    _module = None
# each looked up alone: an extension built from an older source may lack the newer one
_sample = getattr(_module, "sample", None)
_members = getattr(_module, "members", None)


def plain_sample(data: bytes | memoryview) -> tuple[str, dict[str, bytes]] | None:
    """``(key, {ext: data})`` of a span of plain members of one sample, else None (see the module)."""
    if _sample is None:
        return None
    try:
        return _sample(data)
    except (BufferError, TypeError):  # e.g. a memoryview that is not contiguous
        return None


def plain_members(data: bytes | memoryview) -> tuple[str, dict[str, tuple[int, int]]] | None:
    """``(key, {ext: (start, size)})``: where each member of a plain span lies in ``data``
    (nothing copied), else None, as :func:`plain_sample` answers."""
    if _members is None:
        return None
    try:
        return _members(data)
    except (BufferError, TypeError):
        return None
