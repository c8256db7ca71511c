"""Skipped inputs: how many a pack may skip (``--max-skipped``), and their reasons grouped by
kind."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shardkit.errors import PackError

#: A reason's leading place: ``row 101: `` (a table's row), ``images[3]: `` (a COCO record).
_PLACE = re.compile(r"^(?:row \d+|[a-z_]+\[\d+\]): ")


def reason_kind(reason: str) -> str:
    """The kind of a skip reason: its text before any parenthesised detail.

    >>> reason_kind("corrupt image data (broken data stream when reading image file)")
    'corrupt image data'
    >>> reason_kind("empty file (0 bytes)")
    'empty file'
    >>> reason_kind("row 101: no caption"), reason_kind("images[3]: repeated image id (id 7: ...)")
    ('no caption', 'repeated image id')
    """
    kind = _PLACE.sub("", reason, count=1)  # where in a table or a list: each row's own, not its kind
    return kind.split(" (", 1)[0].strip() or reason



def group_reasons(skipped: Iterable[Mapping[str, str]]) -> list[tuple[str, int]]:
    """``(kind, count)`` of skipped entries, most frequent first (ties by name).

    >>> group_reasons([{"source": "a", "reason": "empty file (0 bytes)"},
    ...                {"source": "b", "reason": "not an image (no image format recognised)"},
    ...                {"source": "c", "reason": "empty file (0 bytes)"}])
    [('empty file', 2), ('not an image', 1)]
    """
    counts = Counter(reason_kind(s["reason"]) for s in skipped)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


#: The plural of each kind of skip reason that has one (the rest read as they are: "3 corrupt image data").
_PLURALS = {
    "not an image": "not images", "not a regular file": "not regular files", "empty file": "empty files",
    "unreadable file": "unreadable files", "file too large": "files too large",
    "unreadable image header": "unreadable image headers", "truncated JPEG": "truncated JPEGs",
    "truncated PNG": "truncated PNGs", "decompression bomb refused": "decompression bombs refused",
    "repeated image id": "repeated image ids",
}


def counted_kind(n: int, kind: str) -> str:
    """``n`` inputs skipped for ``kind`` of reason, in words that agree with ``n``.

    >>> counted_kind(1, "empty file"), counted_kind(2, "unreadable file"), counted_kind(3, "not an image")
    ('1 empty file', '2 unreadable files', '3 not images')
    """
    return f"{n:,} {kind if n == 1 else _PLURALS.get(kind, kind)}"


def describe_reasons(skipped: Iterable[Mapping[str, str]]) -> str:
    """``"20 not images, 5 empty files"`` (empty string for no entries)."""
    return ", ".join(counted_kind(n, kind) for kind, n in group_reasons(skipped))


@dataclass(frozen=True)
class SkipBudget:
    """How many inputs a pack may skip before it fails: a ``count``, or a ``percent`` of all inputs.

    Exceeding it fails the pack before ``index.json`` is written. Independently of any budget,
    a pack that would publish no sample at all always fails.

    >>> SkipBudget.parse("5").allowed(1000), SkipBudget.parse("2.5%").allowed(1000)
    (5, 25)
    """

    count: int | None = None
    percent: float | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.percent is None):
            raise ValueError("give exactly one of count and percent")
        if self.count is not None and self.count < 0:
            raise ValueError(f"max skipped must be >= 0, got {self.count}")
        if self.percent is not None and not 0 <= self.percent <= 100:
            raise ValueError(f"max skipped must be between 0% and 100%, got {self.percent}%")

    @classmethod
    def parse(cls, text: str) -> SkipBudget:
        """``"10"`` (inputs) or ``"0.5%"`` (of all inputs); raises ``ValueError`` otherwise."""
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", text)
        if not match:
            raise ValueError(f"invalid skip budget {text!r} (a count like 10, or a percentage like "
                             "0.5%)")
        number, percent = match.groups()
        if percent:
            return cls(percent=float(number))
        if "." in number:
            raise ValueError(f"invalid skip budget {text!r}: a count is a whole number (or write "
                             f"{number}%)")
        return cls(count=int(number))

    def allowed(self, total: int) -> int:
        """Inputs that may be skipped out of ``total``."""
        if self.count is not None:
            return self.count
        return math.floor(total * (self.percent or 0.0) / 100 + 1e-9)

    def __str__(self) -> str:
        return f"{self.count}" if self.count is not None else f"{self.percent:g}%"


class SkipBudgetError(PackError):
    """The pack skipped more inputs than allowed, or packed none; ``index.json`` was not written.

    ``skipped`` holds the ``{source, reason}`` entries known when the pack stopped.
    """

    def __init__(self, message: str, *, where: str, skipped: list[dict[str, str]]) -> None:
        super().__init__(message, where=where)
        self.skipped = skipped


def check_budget(skipped: list[dict[str, str]], total: int, budget: SkipBudget | None, *,
                 where: str, finished: bool) -> None:
    """Raise :class:`SkipBudgetError` when ``skipped`` exceeds ``budget`` of ``total`` inputs, or
    (``finished``: every input was tried) when every input was skipped.
    """
    reasons = describe_reasons(skipped)
    if budget is not None and len(skipped) > budget.allowed(total):
        raise SkipBudgetError(
            f"{len(skipped):,} of {total:,} inputs skipped{' so far' if not finished else ''}, "
            f"more than --max-skipped {budget} allows ({reasons}); index.json not written. "
            "Complete shards are kept: re-run with a larger --max-skipped to publish them, or fix "
            "the inputs and re-run with --overwrite",
            where=where, skipped=skipped,
        )
    if finished and total > 0 and len(skipped) >= total:
        raise SkipBudgetError(
            f"packed no sample: all {total:,} inputs were skipped ({reasons}); index.json not "
            "written",
            where=where, skipped=skipped,
        )
