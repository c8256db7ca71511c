"""What a folder of shards holds beside them, for ``shardkit index``'s refusals and warnings:
tar archives it would leave out (compressed, or named ``.TAR``), or, where it holds no ``.tar``
shard, what it holds instead (compressed shards, shards one folder down, images)."""

from __future__ import annotations

import contextlib
import os
import re

from shardkit.format.spec import COMPRESSED_SHARD_SUFFIXES, IMAGE_EXTENSIONS, SHARD_SUFFIX
from shardkit.storage import Store

__all__ = ["shards_left_out", "why_no_shards"]


def _some(found: list[str]) -> str:
    """The first two of ``found``, and ``...`` for more."""
    return f"{', '.join(found[:2])}{', ...' if len(found) > 2 else ''}"


def _it(found: list[str]) -> str:
    return "it" if len(found) == 1 else "them"


def shards_left_out(names: list[str], urls: list[str]) -> tuple[str | None, str | None]:
    """What indexing says of tar archives beside the ``.tar`` shards that it would leave out
    (compressed, or named ``.TAR``): ``(refusal, warning)``. Those named as the shards are (their
    name, digits at the end aside: ``shard-000007.tar.gz`` beside ``shard-000000.tar``) are shards of
    the set, most likely, whose samples an index would lose without a word: refused. Others
    (``backup.tar.gz``) are said in a warning.

    >>> shards_left_out(["a-0.tar", "a-1.tgz", "old.tgz"], ["a-0.tar"])[0][:77]
    'holds 1 .tar shard and beside it 1 compressed shard (a-1.tgz: decompress it),'
    >>> shards_left_out(["a-0.tar", "old.tgz"], ["a-0.tar"])[1][:60]
    'left out 1 tar archive beside the .tar shards, old.tgz: only'
    """
    stems = {re.sub(r"\d+$", "", n[: -len(SHARD_SUFFIX)]) for n in urls}

    def stem(name: str) -> str:
        low = name.lower()
        suffix = next((x for x in (*COMPRESSED_SHARD_SUFFIXES, SHARD_SUFFIX) if low.endswith(x)), "")
        return re.sub(r"\d+$", "", name[: len(name) - len(suffix)])

    packed = [n for n in names if n.lower().endswith(COMPRESSED_SHARD_SUFFIXES)]
    cased = [n for n in names if n not in urls and n not in packed and n.lower().endswith(SHARD_SUFFIX)]
    like = [n for n in packed + cased if stem(n) in stems]
    others = [n for n in packed + cased if n not in like]

    refusal = warning = None
    if like:
        zipped, upper = [n for n in like if n in packed], [n for n in like if n in cased]
        what = ([f"{len(zipped):,} compressed {'shard' if len(zipped) == 1 else 'shards'} ({_some(zipped)}: "
                 f"decompress {_it(zipped)})"] if zipped else [])
        what += ([f"{_some(upper)} (shard names end in {SHARD_SUFFIX}, in lower case: rename {_it(upper)})"]
                 if upper else [])
        refusal = (f"holds {len(urls):,} {SHARD_SUFFIX} {'shard' if len(urls) == 1 else 'shards'} and beside "
                   f"{'it' if len(urls) == 1 else 'them'} {' and '.join(what)}, which an index would leave out; or "
                   f"move {_it(like)} aside")
    if others:
        warning = (f"left out {len(others):,} tar {'archive' if len(others) == 1 else 'archives'} beside the "
                   f"{SHARD_SUFFIX} shards, {_some(others)}: only {SHARD_SUFFIX} files are indexed (decompress or "
                   f"rename {_it(others)} and index again if {'it holds' if len(others) == 1 else 'they hold'} "
                   "samples of this set)")
    return refusal, warning


def why_no_shards(store: Store, names: list[str]) -> str:
    """What a folder with no ``*.tar`` directly in it holds instead, for the refusal: compressed
    shards, shards named ``.TAR``, or (on a local disk) shards one folder down."""
    packed = [n for n in names if n.lower().endswith(COMPRESSED_SHARD_SUFFIXES)]
    if packed:
        return (f" (found {len(packed):,} compressed {'shard' if len(packed) == 1 else 'shards'}, {_some(packed)}: "
                "decompress them first)")
    cased = [n for n in names if n.lower().endswith(SHARD_SUFFIX)]
    if cased:
        return f" (found {_some(cased)}: shard names end in {SHARD_SUFFIX}, in lower case; rename them)"
    if not store.remote:
        below = _shards_below(store, names)
        if below:
            folders = sorted({name.rsplit("/", 1)[0] for name in below})
            many = (f"; shards in several folders ({_some(folders)}) are datasets of their own: index each, and "
                    "pass them together to ShardLoader([...]) to read them as one" if len(folders) > 1 else "")
            down = "one folder" if below[0].count("/") == 1 else "two folders"
            return (f" (found {_some(below)} {down} down: index the folder that holds the shards; only the "
                    f"files directly in it are read{many})")
        if any(_holds_images(store.path(folder)) for folder in names[:_FOLDERS_LOOKED_INTO]):
            return (" (it holds folders of images, as an ImageFolder tree does: `shardkit pack DIR SHARDS` packs it "
                    "into shards)")
    return ""


def _shards_below(store: Store, names: list[str]) -> list[str]:
    """``*.tar`` files one folder below a local ``store`` (``folder/name``), else two folders below
    (in its first :data:`_FOLDERS_LOOKED_INTO` folders and theirs)."""
    def tars(folder: str) -> list[str]:
        with contextlib.suppress(OSError):  # not a folder, or one this user cannot list
            return [f"{folder}/{f}" for f in sorted(os.listdir(store.path(folder))) if f.endswith(SHARD_SUFFIX)]
        return []

    def folders(folder: str) -> list[str]:
        with contextlib.suppress(OSError):
            return [f"{folder}/{f}" for f in sorted(os.listdir(store.path(folder)))[:_FOLDERS_LOOKED_INTO]
                    if os.path.isdir(store.path(f"{folder}/{f}"))]
        return []

    below = [name for folder in names for name in tars(folder)]
    if below:
        return below
    return [name for folder in names[:_FOLDERS_LOOKED_INTO] for sub in folders(folder) for name in tars(sub)]


_IMAGE_SUFFIXES = tuple(f".{x}" for x in IMAGE_EXTENSIONS)
#: Folders :func:`why_no_shards` looks into for images (a tree with thousands of classes is told by its first).
_FOLDERS_LOOKED_INTO = 8


def _holds_images(folder: str) -> bool:
    """Whether local ``folder`` has an image file directly in it (any it cannot list: no)."""
    try:
        with os.scandir(folder) as entries:
            return any(e.name.lower().endswith(_IMAGE_SUFFIXES) and e.is_file() for e in entries)
    except OSError:
        return False
