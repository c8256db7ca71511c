"""DALI's webdataset index file (what NVIDIA DALI's ``wds2idx`` writes), beside a shard.

DALI's ``fn.readers.webdataset(paths=..., index_paths=...)`` reads these instead of scanning every
tar at start-up. The format (DALI ``tools/wds2idx.py``, version ``v1.2``) is text, one line for
the header and one per sample::

    v1.2 <num_samples>
    <ext> <data offset> <size> <member name> [<ext> <data offset> <size> <member name> ...]

``data offset`` is the byte offset of the member's *data* (not its header) and ``size`` its data
length; ``ext`` is the member name after the first dot of its base name. Only regular members
are listed, grouped into samples by key, in tar order. shardkit names the file
``<shard without .tar>.dali.idx`` so it never collides with shardkit's own offsets file
(``.idx``, docs/concepts/format.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.errors import FormatError
from shardkit.format.spec import SHARD_SUFFIX
from shardkit.format.tarread import TarEntry, sample_key

DALI_INDEX_VERSION = "v1.2"
DALI_INDEX_SUFFIX = ".dali.idx"


@dataclass(frozen=True)
class DaliMember:
    """One member as a DALI index lists it."""

    ext: str
    offset: int
    size: int
    name: str


def dali_index_name(shard: str) -> str:
    """Name of the DALI index beside ``shard``: ``x-000000.tar`` -> ``x-000000.dali.idx``."""
    base = shard[: -len(SHARD_SUFFIX)] if shard.endswith(SHARD_SUFFIX) else shard
    return base + DALI_INDEX_SUFFIX


def dump_dali_index(entries: Sequence[TarEntry], *, where: str) -> bytes:
    """Serialise a shard's regular members (from :func:`~shardkit.format.tarread.iter_entries`)
    as a DALI index.

    Raises:
        FormatError: a member name holds whitespace (DALI's format is space-separated), or the
            shard has no members (DALI refuses an empty index).
    """
    samples: list[list[DaliMember]] = []
    last: str | None = None
    for entry in entries:
        if any(c.isspace() for c in entry.name):
            raise FormatError(f"member {entry.name!r} has whitespace in its name: DALI's index "
                              "cannot list it",
                              where=where)
        key, ext = sample_key(entry.name, where=where)
        member = DaliMember(ext, entry.data_offset, entry.size, entry.name)
        if key == last:
            samples[-1].append(member)
        else:
            samples.append([member])
            last = key
    if not samples:
        raise FormatError("shard has no members: DALI's index cannot describe an empty shard",
                          where=where)
    lines = [f"{DALI_INDEX_VERSION} {len(samples)}"]
    lines.extend(" ".join(f"{m.ext} {m.offset} {m.size} {m.name}" for m in sample)
                 for sample in samples)
    return ("\n".join(lines) + "\n").encode("utf-8")


def load_dali_index(data: bytes, *, where: str) -> list[list[DaliMember]]:
    """Parse a DALI index (``v1.2``) into samples of members; ``FormatError`` if malformed."""
    try:
        lines = data.decode("utf-8").splitlines()
        version, count_text = lines[0].split()
        count = int(count_text)
    except (UnicodeDecodeError, IndexError, ValueError) as err:
        raise FormatError("not a DALI webdataset index", where=where) from err
    if version != DALI_INDEX_VERSION:
        raise FormatError(f"unknown DALI index version {version!r} (expected {DALI_INDEX_VERSION})",
                          where=where)
    samples = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split()
        if not parts or len(parts) % 4:
            raise FormatError(f"malformed line {number}", where=where)
        try:
            members = [DaliMember(parts[i], int(parts[i + 1]), int(parts[i + 2]), parts[i + 3])
                       for i in range(0, len(parts), 4)]
        except ValueError as err:
            raise FormatError(f"malformed offset or size on line {number}", where=where) from err
        samples.append(members)
    if len(samples) != count:
        raise FormatError(f"header says {count} samples, file lists {len(samples)}", where=where)
    return samples
