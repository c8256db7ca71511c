"""A read-through wrapper that counts and sha256-hashes every byte read (one pass per shard)."""

from __future__ import annotations

import hashlib
import io
from typing import BinaryIO


class HashingReader(io.RawIOBase):
    """Wrap a binary file: count and hash everything read through it.

    Example: ``r = HashingReader(f); io.BufferedReader(r).read(); r.hash.hexdigest()``.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.hash = hashlib.sha256()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.hash.update(data)
        self.count += n
        return n
