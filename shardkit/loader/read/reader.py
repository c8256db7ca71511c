"""Random access to samples of a packed dataset: ``(shard, index) -> {ext: bytes}``.

Local shards are read with ``os.pread`` at offsets from the ``.idx`` files. Remote shards are
first copied whole into a local :class:`~shardkit.loader.read.cache.ShardCache` (keyed by content
hash, fetched once per node, bounded), then read the same way. Open files are kept in a small LRU.

Nothing ``index.json`` or an offsets file claims is trusted before it is checked: the shard
files of a local dataset must be able to hold the samples the manifest claims (checked when the
reader is made, before the loader plans an epoch); every span of an offsets file must be
block-aligned, in order, non-overlapping, inside the shard's ``num_bytes`` and at most
:data:`~shardkit.loader.read.claims.MAX_SAMPLE_BYTES` (checked when the shard is opened, before
anything is read); and the sample read must carry the key the offsets file gives it. The checks
themselves are in :mod:`~shardkit.loader.read.claims`.

One reader may span several datasets (:meth:`ShardReader.joined`, for a mix): their shards are
numbered one after another, dataset by dataset, and each is read from its own store.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import FormatError, LoaderError, StorageError
from shardkit.format.crc import crc32
from shardkit.format.offsets import REPAIR, load_offsets
from shardkit.format.spec import IMAGE_MEMBER_EXTENSIONS, offsets_name
from shardkit.format.tarread import parse_span, scan_spans
from shardkit.format.tarspan import plain_members
from shardkit.index.shards import ShardEntry, ShardTable
from shardkit.loader.read.cache import DEFAULT_CACHE_BYTES, ShardCache, default_cache_dir
from shardkit.loader.read.claims import check_claims, check_hash, check_spans
from shardkit.storage import Store
from shardkit.storage.local import open_regular


class CorruptSample(LoaderError):
    """One sample of a shard cannot be read (damaged header, key differing from the offsets
    file) while the shard itself opened: the rest of the shard may still be read, so a batch
    builder with ``on_error="replace"`` may replace this sample. ``where`` is ``<shard>:<key>``.

    A shard file shorter than its samples need is not one bad sample but a lost tail (an
    interrupted copy or download): that is a plain :class:`LoaderError` naming the shard, never
    replaced silently."""


#: Samples of a shard, spread through it, that :func:`_written_again` looks at beside one that
#: differs from its CRC-32; at least :data:`STALE_AFTER` of them, all differing, make the shard one
#: written again since its offsets file, not one with a few damaged samples.
STALE_LOOKS = 8
STALE_AFTER = 3


def _written_again(shard: _OpenShard, bad: int) -> int:
    """How many other samples of ``shard`` were looked at, where every one of them (at least
    :data:`STALE_AFTER`) differs from its CRC-32 as sample ``bad`` does; 0 where any matches, or
    too few could be looked at (a shard of a few samples: they are replaced one by one)."""
    assert shard.crcs is not None
    n = len(shard.offsets)
    others = [i for i in dict.fromkeys(round(k * (n - 1) / max(STALE_LOOKS, 1)) for k in range(STALE_LOOKS + 1))
              if i != bad and shard.crcs[i] is not None][:STALE_LOOKS]
    if len(others) < STALE_AFTER:
        return 0
    for i in others:
        offset, size = shard.offsets[i]
        if offset + size > shard.size or crc32(os.pread(shard.fd, size, offset)) == shard.crcs[i]:
            return 0
    return len(others)


class _OpenShard:
    def __init__(self, fd: int, offsets: list[tuple[int, int]], keys: list[str],
                 crcs: list[int | None] | None = None, where: str = "", scanned: bool = False,
                 labels: tuple[int, int | None] = (0, None)) -> None:
        self.size = os.fstat(fd).st_size
        self.fd = fd  # only once taken: a constructor that raised leaves the caller to close it
        self.where = where  # the shard's path or URL, to name it in errors
        self.offsets = offsets
        self.keys = keys
        self.crcs = crcs  # each sample's CRC-32 from an offsets file of version 2, else None
        self.scanned = scanned  # no offsets file: the spans come from reading the shard's headers
        self.labels = labels  # (label offset, own class count or None) of its dataset, as ShardReader.labels_of
        self.judged = False  # a sample of it differed from its CRC-32 and the shard was looked at whole

    def close(self) -> None:
        fd, self.fd = self.fd, -1  # closed once: a second close() or __del__ must not close a reused number
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        # a reader dropped without close() (a ShardLoader left to the garbage collector) closes its
        # shard files with it, as a file object does; a raw descriptor would stay open for good
        if getattr(self, "fd", -1) >= 0:
            with contextlib.suppress(OSError):
                self.close()


@dataclass(frozen=True)
class ReaderPart:
    """One dataset of a joined reader: its store and shards, and where its labels go in the mix.

    ``label_offset`` is added to the dataset's packed labels; ``num_classes`` (when its labels
    are offset) is its own class count, which a packed label must stay below."""

    store: Store
    shards: ShardTable  # any sequence of ShardEntry is taken, and held as a table
    label_offset: int = 0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", ShardTable.from_entries(self.shards))


class ShardReader:
    """Read samples by ``(shard index, sample index in shard)``; picklable, opens lazily.

    ``cache_dir`` holds local copies of remote shards (created if missing), at most about
    ``cache_bytes`` (see :class:`~shardkit.loader.read.cache.ShardCache`); at most ``max_open``
    shards stay open.

    ``verify_hashes=True``: the first time this process opens a shard, all its bytes are hashed
    and compared with the manifest's ``sha256`` (a mismatch is a :class:`LoaderError` naming the
    shard), so no silently damaged byte is delivered; costs one extra sequential read of each
    shard per process (sha256 runs at about 1.5 GB/s per core). Remote shards are always hashed
    when fetched into the cache.
    """

    def __init__(self, store: Store, shards: ShardTable | Sequence[ShardEntry], *, cache_dir: str | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, max_open: int = 16, verify_hashes: bool = False) -> None:
        shards = ShardTable.from_entries(shards)
        check_claims(store, shards)
        #: The (first) dataset's store; a joined reader reads shard ``i`` from :meth:`store_of`.
        self.store = store
        self.shards = shards
        self._parts: tuple[ReaderPart, ...] = (ReaderPart(store, shards),)
        self._firsts = [0]  # the first shard of each part
        self.cache = (ShardCache(cache_dir, cache_bytes, private=cache_dir == default_cache_dir())
                      if cache_dir is not None else None)
        self.max_open = max_open
        self.verify_hashes = verify_hashes
        self._verified: set[int] = set()
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()

    @classmethod
    def joined(cls, parts: Sequence[ReaderPart], *, cache_dir: str | None = None,
               cache_bytes: int = DEFAULT_CACHE_BYTES, max_open: int = 16,
               verify_hashes: bool = False) -> ShardReader:
        """One reader over several datasets: shard ``i`` of part ``p`` is shard
        ``len(parts[0].shards) + ... + len(parts[p-1].shards) + i``, read from ``parts[p].store``.

        Raises:
            LoaderError: no parts, or a local part's files cannot hold what its manifest claims.
        """
        if not parts:
            raise LoaderError("a joined reader needs at least one dataset")
        reader = cls(parts[0].store, parts[0].shards, cache_dir=cache_dir, cache_bytes=cache_bytes,
                     max_open=max_open, verify_hashes=verify_hashes)
        for part in parts[1:]:
            check_claims(part.store, part.shards)
        reader._parts = tuple(parts)
        reader._firsts = [0]
        for part in parts[:-1]:
            reader._firsts.append(reader._firsts[-1] + len(part.shards))
        reader.shards = ShardTable.join([part.shards for part in parts])
        return reader

    def _part(self, shard_index: int) -> ReaderPart:
        return self._parts[bisect.bisect_right(self._firsts, shard_index) - 1]

    def store_of(self, shard_index: int) -> Store:
        """The store shard ``shard_index`` is read from."""
        return self._part(shard_index).store

    def where(self, shard_index: int) -> str:
        """The path or URL of shard ``shard_index``, to name it in errors."""
        shard = self._open.get(shard_index)
        return shard.where if shard is not None else self.store_of(shard_index).path(self.shards.urls[shard_index])

    def unchecked(self, shard_index: int) -> bool:
        """Whether shard ``shard_index`` (opened if it is not) has no offsets file beside it (its
        samples were found by reading its tar headers, and none is checked against a CRC-32) and
        its sha256 is not checked either (a local shard without ``verify_hashes``; a remote one
        is hashed as it is fetched and before each process's first use)."""
        return self._shard(shard_index).scanned and not self.verify_hashes and not self.store_of(shard_index).remote

    def labels_of(self, shard_index: int) -> tuple[int, int | None]:
        """``(label offset, own class count or None)`` of shard ``shard_index``'s dataset (see
        :class:`ReaderPart`): ``(0, None)`` unless its labels are offset in a mix."""
        part = self._part(shard_index)
        return part.label_offset, part.num_classes

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        return state

    def _open_fd(self, store: Store, entry: ShardEntry) -> int:
        if not store.remote:
            return open_regular(store.path(entry.url))
        if self.cache is None:
            raise LoaderError("a remote dataset needs a cache_dir for its shards", where=store.url)
        return self.cache.open(store, entry)

    def key(self, shard_index: int, sample_index: int) -> str:
        """The key of one sample (from the shard's offsets; opens the shard if needed)."""
        return self._shard(shard_index).keys[sample_index]

    def _shard(self, i: int) -> _OpenShard:
        shard = self._open.get(i)
        if shard is not None:
            self._open.move_to_end(i)
            return shard
        entry, part = self.shards[i], self._part(i)
        store = part.store
        where = store.path(entry.url)
        fd = -1
        try:
            fd = self._open_fd(store, entry)
            if self.verify_hashes and i not in self._verified:
                check_hash(fd, entry, where)
                self._verified.add(i)
            idx = offsets_name(entry.url)
            raw = store.read_optional(idx)
            crcs: list[int | None] | None = None
            if raw is not None:
                try:
                    listed = load_offsets(raw, where=store.path(idx))
                except FormatError as err:
                    raise FormatError(f"{err.message}; {REPAIR}", where=err.where) from err
                spans = [(s.key, s.offset, s.size) for s in listed]
                crcs = [s.crc32 for s in listed]
            else:
                with os.fdopen(os.dup(fd), "rb") as f:
                    spans = scan_spans(f, where=where)
            check_spans(spans, entry.num_bytes, where=store.path(idx) if raw is not None else where)
            shard = _OpenShard(fd, [(o, n) for _, o, n in spans], [k for k, _, _ in spans], crcs, where,
                               scanned=raw is None, labels=(part.label_offset, part.num_classes))
        except (StorageError, OSError) as err:
            if fd >= 0:
                os.close(fd)
            detail = err.message if isinstance(err, StorageError) else str(err)
            raise LoaderError(f"cannot read shard ({detail})", where=where) from err
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        if len(shard.offsets) != entry.num_samples:
            shard.close()
            raise LoaderError(f"shard has {len(shard.offsets)} samples, index.json says {entry.num_samples}",
                              where=where)
        self._open[i] = shard
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return shard

    def span_size(self, shard_index: int, sample_index: int) -> int:
        """Bytes of one sample's span in its shard (its members with their tar headers), what
        :meth:`read_into` reads (opens the shard if needed)."""
        return self._shard(shard_index).offsets[sample_index][1]

    def read(self, shard_index: int, sample_index: int) -> tuple[str, dict[str, bytes]]:
        """The key and ``{ext: bytes}`` fields of one sample.

        Raises:
            LoaderError: the shard is missing, truncated or does not match the manifest
                (names the shard and sample).
        """
        shard, offset, size = self._span(shard_index, sample_index)
        data = os.pread(shard.fd, size, offset)
        return self._parsed(shard, sample_index, data)

    def read_into(self, shard_index: int, sample_index: int, out: memoryview
                  ) -> tuple[str, dict[str, bytes], dict[str, tuple[int, int]]]:
        """:meth:`read` with the span read straight into ``out`` (:meth:`span_size` bytes long).

        Returns the key, the fields copied out as bytes, and ``placed``: ``{ext: (start, size)}``
        of the image members left in ``out`` instead (not among the fields: nothing copied). A
        span the plain parser does not take (:func:`~shardkit.format.tarspan.plain_members`) has
        every member copied out.

        Raises:
            LoaderError: as :meth:`read`.
        """
        shard, offset, size = self._span(shard_index, sample_index)
        if len(out) != size:
            raise ValueError(f"read_into needs {size} bytes of room, got {len(out)}")
        return self._read_into(shard, sample_index, offset, out)

    def read_sample(self, shard_index: int, sample_index: int,
                    reserve: Callable[[int], tuple[int, memoryview] | None] | None = None
                    ) -> tuple[str, dict[str, bytes], dict[str, tuple[int, int]], tuple[int, memoryview] | None,
                               str, tuple[int, int | None]]:
        """One sample and what names and labels it, the shard looked up once: ``(key, fields,
        placed, room, where, labels)``. ``reserve(size)`` gives ``room``, ``(start, view)`` of
        :meth:`span_size` bytes to read the span into as :meth:`read_into` does, or None (or there
        is no ``reserve``): read as :meth:`read` does, ``placed`` empty. ``where`` is the shard's
        (:meth:`where`), ``labels`` its dataset's (:meth:`labels_of`).

        Raises:
            LoaderError: as :meth:`read`.
        """
        shard, offset, size = self._span(shard_index, sample_index)
        room = reserve(size) if reserve is not None else None
        if room is not None and len(room[1]) != size:
            raise ValueError(f"read_sample needs {size} bytes of room, got {len(room[1])}")
        if room is None:
            key, fields = self._parsed(shard, sample_index, os.pread(shard.fd, size, offset))
            return key, fields, {}, None, shard.where, shard.labels
        return (*self._read_into(shard, sample_index, offset, room[1]), room, shard.where, shard.labels)

    def _read_into(self, shard: _OpenShard, sample_index: int, offset: int, out: memoryview
                   ) -> tuple[str, dict[str, bytes], dict[str, tuple[int, int]]]:
        got = os.preadv(shard.fd, [out], offset)
        data = out[:got]  # short only where the file shrank since it was opened: the parse then names it
        self._check_crc(shard, sample_index, data)
        members = plain_members(data)
        if members is None or members[0] != shard.keys[sample_index]:
            return (*self._parsed(shard, sample_index, data, crc_checked=True), {})
        key, spans = members
        fields: dict[str, bytes] = {}
        placed: dict[str, tuple[int, int]] = {}
        for ext, (start, length) in spans.items():
            if ext in IMAGE_MEMBER_EXTENSIONS:
                placed[ext] = (start, length)
            else:
                fields[ext] = bytes(data[start:start + length])
        return key, fields, placed

    def _span(self, shard_index: int, sample_index: int) -> tuple[_OpenShard, int, int]:
        """The open shard and ``(offset, size)`` of one sample's span, checked against the file's size."""
        shard = self._shard(shard_index)
        offset, size = shard.offsets[sample_index]
        if offset + size > shard.size:
            raise LoaderError(f"shard is truncated ({shard.size} bytes, sample ends at {offset + size}; "
                              f"index.json says {self.shards.num_bytes[shard_index]} bytes)",
                              where=f"{shard.where}:{shard.keys[sample_index]}")
        return shard, offset, size

    @staticmethod
    def _check_crc(shard: _OpenShard, sample_index: int, data: bytes | memoryview) -> None:
        """:class:`CorruptSample` where the offsets file's CRC-32 does not match ``data``. The first
        such sample of an open shard has the shard looked at (:func:`_written_again`): a
        :class:`LoaderError` where it was written again (replacing its samples one by one would
        train on others in their place)."""
        expected = shard.crcs[sample_index] if shard.crcs is not None else None
        if expected is None or (crc := crc32(data)) == expected:
            return
        if not shard.judged:
            shard.judged = True
            checked = _written_again(shard, sample_index)
            if checked:
                raise LoaderError(f"shard's bytes changed since it was packed or indexed: this sample and the "
                                  f"{checked} others looked at, spread through it, all differ from their CRC-32 in "
                                  "its offsets file (written again in place?); pack it again, or, if its new bytes "
                                  "are meant, index the adopted dataset again (shardkit index --overwrite)",
                                  where=shard.where)
        where = f"{shard.where}:{shard.keys[sample_index]}"
        raise CorruptSample(f"checksum mismatch: its bytes changed after packing or indexing (crc32 {crc:08x}, "
                            f"the offsets file says {expected:08x})", where=where)

    def _parsed(self, shard: _OpenShard, sample_index: int, data: bytes | memoryview, *,
                crc_checked: bool = False) -> tuple[str, dict[str, bytes]]:
        """A span's key and fields, its CRC-32 checked (unless ``crc_checked``) and its key too."""
        if not crc_checked:
            self._check_crc(shard, sample_index, data)
        try:
            key, fields = parse_span(data, where=shard.where)
        except FormatError:
            where = f"{shard.where}:{shard.keys[sample_index]}"
            try:  # again, so that the error's own place names the sample (errors are rare, parsing cheap)
                parse_span(data, where=where)
            except FormatError as err:
                raise CorruptSample(f"corrupt shard: {err.message}", where=where) from err
            raise
        if key != shard.keys[sample_index]:
            raise CorruptSample(f"the offsets file names this sample {shard.keys[sample_index]!r}, the shard {key!r} "
                                "(the offsets file or the shard is damaged)",
                                where=f"{shard.where}:{shard.keys[sample_index]}")
        return key, fields

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


__all__ = ["CorruptSample", "ReaderPart", "ShardReader"]
