"""CRC-32 with zlib's polynomial and values, computed by zlib-ng where it is installed.

Pack records the CRC-32 of every sample in its shard's offsets file, and the loader checks it on
every read: for a GPU-route worker, which ships JPEG bytes without decoding them, that check is
one of the largest costs per image. CPython's ``zlib.crc32`` runs zlib's byte-table loop; zlib-ng's
folds with the CPU's carry-less multiply (PCLMULQDQ on x86, PMULL on ARM) and returns the same
value many times faster (figures: ``docs/performance.md``). Where the ``zlib-ng`` wheel is missing
(an install made without dependencies), zlib's is used: same values, slower.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

__all__ = ["FAST", "crc32"]

crc32: Callable[..., int]
"""``crc32(data, value=0) -> int``: zlib.crc32's signature and values."""
FAST: bool
"""Whether :data:`crc32` is zlib-ng's."""

try:
    from zlib_ng import zlib_ng as _zlib_ng
except ImportError:  # zlib-ng is a dependency: this is an install made without it
    crc32, FAST = zlib.crc32, False
else:
    crc32, FAST = _zlib_ng.crc32, True
