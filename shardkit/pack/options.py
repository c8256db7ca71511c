"""Options of a pack run, and parsing of human sizes like ``256MB``."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from shardkit.format.spec import check_prefix

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """Parse ``"256MB"``, ``"1.5GiB"``, ``"4096"`` (bytes) into a byte count.

    >>> parse_size("256MB")
    256000000
    """
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r} (examples: 256MB, 1GiB, 100000)")
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class PackOptions:
    """What a pack run does to its input; recorded in ``index.json`` ``options``.

    ``max_count``/``max_size`` bound each shard (``max_size`` is planned from input file sizes
    plus tar overhead; a single larger sample still gets its own shard). ``shuffle``/``seed``
    permute samples across shards. ``resize_max``: re-encode images whose shorter side exceeds
    it to JPEG of that shorter side at ``quality``. ``decode_check``: fully decode every image
    to detect corruption (slower; by default headers and end markers are checked).
    """

    max_count: int = 1000
    max_size: int = 256 * 10**6
    shuffle: bool = True
    seed: int = 0
    prefix: str = "shard"
    resize_max: int | None = None
    quality: int = 90
    decode_check: bool = False

    def __post_init__(self) -> None:
        if self.max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {self.max_count}")
        if self.max_size < 1:
            raise ValueError(f"max_size must be >= 1 byte, got {self.max_size}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.resize_max is not None and self.resize_max < 1:
            raise ValueError(f"resize_max must be >= 1 pixel, got {self.resize_max}")
        check_prefix(self.prefix)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
