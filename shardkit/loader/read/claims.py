"""Checks of what a packed dataset claims before a reader trusts it: that ``index.json``'s largest
shards can hold the samples it gives them (:func:`check_claims`, when a reader is made), that an
offsets file's spans are ones a tar can have (:func:`check_spans`, when a shard is opened), and
that a shard's bytes match the size and sha256 ``index.json`` gives (:func:`check_hash`).
:mod:`~shardkit.loader.read.reader` makes them.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import NamedTuple

import numpy as np

from shardkit.errors import LoaderError
from shardkit.format.tarread import BLOCK, MAX_MEMBER_BYTES
from shardkit.index.shards import ShardEntry, ShardTable
from shardkit.machine import first_on_host
from shardkit.storage import Store
from shardkit.storage.local import file_kind

__all__ = ["CHECKED_UP_FRONT", "CHECKED_WHOLE", "MAX_SAMPLE_BYTES", "check_claims", "check_hash", "check_spans",
           "checks_every_file", "FileFault", "file_faults"]

#: The largest sample span read (all of a sample's members with their headers): one member of the
#: largest size a shard may hold (``MAX_MEMBER_BYTES``) and a little room for the small ones.
MAX_SAMPLE_BYTES = MAX_MEMBER_BYTES + (1 << 20)


def check_spans(spans: list[tuple[str, int, int]], num_bytes: int, *, where: str) -> None:
    """Refuse spans no shard of ``num_bytes`` bytes written as a tar can have.

    Each ``(key, offset, size)`` must start on a 512-byte block, cover whole blocks (at least
    one), start at or after the previous span's end, end inside ``num_bytes`` and be at most
    :data:`MAX_SAMPLE_BYTES`. Raises ``LoaderError`` naming ``where`` and the line of the offsets
    file (span ``i`` is line ``i + 2``).
    """
    end = 0
    for i, (key, offset, size) in enumerate(spans):
        line = f"line {i + 2}: sample {key!r}"
        if offset % BLOCK or size % BLOCK or size < BLOCK:
            raise LoaderError(f"{line} has offset {offset} and size {size}, not a multiple of {BLOCK} "
                              "(the offsets file is damaged)", where=where)
        if offset < end:
            raise LoaderError(f"{line} starts at byte {offset}, which overlaps the previous sample (ends at "
                              f"{end}; the offsets file is damaged)", where=where)
        if size > MAX_SAMPLE_BYTES:
            raise LoaderError(f"{line} spans {size} bytes, more than the {MAX_SAMPLE_BYTES} a sample may have",
                              where=where)
        end = offset + size
        if end > num_bytes:
            raise LoaderError(f"{line} ends at byte {end}, past the shard's {num_bytes} bytes "
                              "(the offsets file is damaged)", where=where)


#: Shards whose files are compared with their claims when a reader is made: those claiming the
#: most samples. A ``stat`` costs 15-25 us on a busy 2-core VM (8-12 s for 5e5 shards), so in a
#: dataset of more than :data:`CHECKED_WHOLE` shards every other shard is checked when it is
#: opened (its sample count against its offsets file, its size on every read), which is also where
#: a missing or non-regular file is named.
CHECKED_UP_FRONT = 64
#: A local dataset of at most this many shards has every shard's file checked when a reader is
#: made (there, missing, not a regular file, or not of the size ``index.json`` gives), so that a
#: damaged shard stops the loader before an epoch starts rather than partway through it: at most
#: 0.25 s on that VM, a few ms on a usual machine. On a network file system a ``stat`` may cost a
#: millisecond, so only the node's first process checks them all
#: (:func:`~shardkit.machine.first_on_host`: ``LOCAL_RANK``, ``SLURM_LOCALID`` or
#: ``OMPI_COMM_WORLD_LOCAL_RANK`` 0, or none set); the node's other ranks check the largest, as a
#: larger dataset does.
CHECKED_WHOLE = 10_000


def checks_every_file(shards: int) -> bool:
    """Whether a reader made here of a local dataset of ``shards`` shards checks every shard's
    file (see :data:`CHECKED_WHOLE`)."""
    return shards <= CHECKED_WHOLE and first_on_host()


def check_claims(store: Store, shards: ShardTable) -> None:
    """Refuse a local dataset whose files do not match ``index.json`` before the loader plans an
    epoch of them.

    Up to :data:`CHECKED_WHOLE` shards, in a node's first process, each shard's file must be
    there, a regular file, and of the size ``index.json`` gives (the error names the first shard
    found otherwise and counts the rest). Elsewhere, the dataset's largest shards (by claimed
    samples, :data:`CHECKED_UP_FRONT` of them) must hold the samples ``index.json`` claims for
    them: every sample takes at least one 512-byte block, so files of ``B`` bytes hold at most
    ``B / 512`` samples. Their sum is compared (not each shard); the others are checked as they
    are opened."""
    if store.remote or not len(shards):
        return  # a remote shard's size is checked when it is fetched
    n = len(shards)
    if checks_every_file(n):
        _check_files(store, shards)
        return
    top = np.arange(n) if n <= CHECKED_UP_FRONT else np.argpartition(-shards.num_samples, CHECKED_UP_FRONT)[
        :CHECKED_UP_FRONT]
    top = np.sort(top)
    held = np.zeros(len(top), dtype=np.int64)
    for j, i in enumerate(top.tolist()):
        path = store.path(shards.urls[i])
        try:
            st = os.stat(path)
        except OSError:
            continue  # missing: reported by name when it is opened
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the first read for ever
            raise LoaderError(f"not a regular file ({file_kind(st.st_mode)})", where=path)
        held[j] = st.st_size
    claims = shards.num_samples[top]
    if int(claims.sum()) * BLOCK > int(held.sum()):
        j = int(np.argmax(claims * BLOCK - held))
        i = int(top[j])
        which = f"the {len(top)} shards claiming the most" if n > len(top) else f"its {n} shards"
        raise LoaderError(
            f"index.json claims {int(claims.sum())} samples in {which}, "
            f"but their files hold {int(held.sum())} bytes in all, too few for that many (each sample takes at least "
            f"{BLOCK} bytes); e.g. this shard has {held[j]} bytes, index.json says {claims[j]} samples in "
            f"{shards.num_bytes[i]} bytes", where=store.path(shards.urls[i]))


class FileFault(NamedTuple):
    """A local shard whose file does not match ``index.json`` (:func:`file_faults`): ``what`` is
    ``"missing"``, ``"unreadable"`` (``detail``: the error), ``"not regular"`` (``detail``: what
    it is, e.g. ``"a FIFO"``) or ``"size"`` (``detail``: the file's size in bytes)."""

    shard: int
    path: str
    what: str
    detail: str | int | None = None


def file_faults(store: Store, shards: ShardTable) -> list[FileFault]:
    """A ``stat`` of every shard's file in local ``store``: those missing, unreadable, not regular
    files, or of another size than ``index.json`` gives, in shard order."""
    faults = []
    for i, size in enumerate(shards.num_bytes.tolist()):
        path = store.path(shards.urls[i])
        try:
            st = os.stat(path)
        except FileNotFoundError:
            faults.append(FileFault(i, path, "missing"))
            continue
        except OSError as err:
            faults.append(FileFault(i, path, "unreadable", err.strerror))
            continue
        if not stat.S_ISREG(st.st_mode):
            faults.append(FileFault(i, path, "not regular", file_kind(st.st_mode)))
        elif st.st_size != size:
            faults.append(FileFault(i, path, "size", st.st_size))
    return faults


def _check_files(store: Store, shards: ShardTable) -> None:
    faults = file_faults(store, shards)
    if not faults:
        return
    first, size = faults[0], int(shards.num_bytes[faults[0].shard])
    what = {"missing": "shard is missing (index.json lists it with {size:,} bytes)",
            "unreadable": "cannot read shard ({detail})",
            "not regular": "not a regular file ({detail})",
            "size": "shard has {detail:,} bytes, index.json says {size:,} "
                    "(cut short, or replaced without packing or indexing again)"}[first.what]
    what = what.format(detail=first.detail, size=size)
    others = len(faults) - 1
    verb = "is" if others == 1 else "are"
    more = f"; {others} more of the {len(shards)} shards {verb} damaged too" if others else ""
    raise LoaderError(f"{what}{more}; shardkit verify checks every shard", where=first.path)


def check_hash(fd: int, entry: ShardEntry, where: str) -> None:
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, 8 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    if offset != entry.num_bytes or digest.hexdigest() != entry.sha256:
        raise LoaderError(f"shard's bytes differ from index.json ({offset} bytes with sha256 {digest.hexdigest()}, "
                          f"index.json says {entry.num_bytes} bytes with {entry.sha256}): damaged or replaced",
                          where=where)
