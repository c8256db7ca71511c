"""A read-through wrapper that counts and sha256-hashes every byte read (one pass per shard),
and can give the CRC-32 of a span of what it read, so that ``shardkit index`` writes each
adopted sample's checksum from the same pass."""

from __future__ import annotations

import hashlib
import io
from collections import deque
from typing import BinaryIO

from shardkit.format.crc import crc32


class HashingReader(io.RawIOBase):
    """Wrap a binary file: count and hash everything read through it. ``keep=True`` also keeps
    the bytes read since the last :meth:`release`, for :meth:`crc32` of a span of them.

    Example: ``r = HashingReader(f); io.BufferedReader(r).read(); r.hash.hexdigest()``.
    """

    def __init__(self, raw: BinaryIO, *, keep: bool = False) -> None:
        self._raw = raw
        self.hash = hashlib.sha256()
        self.count = 0
        self._keep = keep
        self._chunks: deque[tuple[int, bytes]] = deque()  # (offset, bytes) read and not released

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.hash.update(data)
        if self._keep and n:
            self._chunks.append((self.count, bytes(data)))
        self.count += n
        return n

    def crc32(self, start: int, end: int, value: int = 0) -> int:
        """The CRC-32 of bytes ``[start, end)`` of the stream (``keep=True``; read, not released),
        continuing ``value`` (the CRC-32 of the bytes before them, as ``zlib.crc32``'s second argument).

        Raises:
            ValueError: part of the span was released or not read yet.
        """
        if not self._keep or end > self.count or (start < end and (not self._chunks or start < self._chunks[0][0])):
            raise ValueError(f"bytes {start}..{end} are not kept (read {self.count:,})")
        for offset, data in self._chunks:
            if offset >= end:
                break
            if offset + len(data) > start:
                value = crc32(memoryview(data)[max(start - offset, 0):end - offset], value)
        return value

    def release(self, upto: int) -> None:
        """Forget the bytes before ``upto`` (whole chunks; a chunk reaching past it stays)."""
        while self._chunks and self._chunks[0][0] + len(self._chunks[0][1]) <= upto:
            self._chunks.popleft()
