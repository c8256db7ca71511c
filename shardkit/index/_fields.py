"""Typed field readers for ``index.json``: each raises ``ManifestError`` naming the bad field."""

from __future__ import annotations

from typing import Any

from shardkit.errors import ManifestError

#: Counts and sizes are below 2**63: they travel in 64-bit integers (tensors, ``os.pread`` offsets).
MAX_INTEGER = 1 << 63


def _kind_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def integer(value: Any, field: str, where: str) -> int:
    """``value`` as a non-negative int; ``bool`` is refused (JSON ``true`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"field {field!r} must be an integer, not {_kind_name(value)}",
                            where=where)
    if value < 0:
        raise ManifestError(f"field {field!r} must not be negative", where=where)
    if value >= MAX_INTEGER:
        raise ManifestError(f"field {field!r} is too large ({value.bit_length()} bits; a count or size is below "
                            "2**63)", where=where)
    return value


def string(value: Any, field: str, where: str) -> str:
    """``value`` if it is a string."""
    if not isinstance(value, str):
        raise ManifestError(f"field {field!r} must be a string, not {_kind_name(value)}",
                            where=where)
    return value


def obj(value: Any, field: str, where: str) -> dict[str, Any]:
    """``value`` if it is a JSON object."""
    if not isinstance(value, dict):
        raise ManifestError(f"field {field!r} must be an object, not {_kind_name(value)}",
                            where=where)
    return value


def array(value: Any, field: str, where: str) -> list[Any]:
    """``value`` if it is a JSON list."""
    if not isinstance(value, list):
        raise ManifestError(f"field {field!r} must be a list, not {_kind_name(value)}", where=where)
    return value


def string_list(value: Any, field: str, where: str) -> tuple[str, ...]:
    """A list of strings (``classes``)."""
    return tuple(string(v, f"{field}[{i}]", where)
                 for i, v in enumerate(array(value, field, where)))


def object_list(value: Any, field: str, where: str) -> tuple[dict[str, Any], ...]:
    """A list of objects (``categories``)."""
    return tuple(obj(v, f"{field}[{i}]", where) for i, v in enumerate(array(value, field, where)))


def skipped_list(value: Any, field: str, where: str) -> tuple[dict[str, str], ...]:
    """A list of ``{source, reason}`` objects with string values."""
    entries = object_list(value, field, where)
    for i, entry in enumerate(entries):
        for key in ("source", "reason"):
            string(entry.get(key), f"{field}[{i}].{key}", where)
    return entries
