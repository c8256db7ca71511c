"""Adopt WebDataset shards written by another tool: index them in place, without rewriting.

``adopt_shards`` reads every ``*.tar`` under a directory or URL prefix once (hashing it on the
way), groups members into samples, takes each sample's label from its ``cls`` member, and writes
what ``shardkit pack`` would have written beside the shards: an offsets file per shard (with each
sample's CRC-32, from the same pass) and
``index.json`` last (flagged ``adopted``, docs/concepts/format.md §8), optionally DALI index files. The shards
themselves are never modified, so other tools keep reading them as before.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.errors import FormatError, ManifestError
from shardkit.format.bounded import parse_json
from shardkit.format.dali_index import dali_index_name, dump_dali_index
from shardkit.format.offsets import dump_offsets, load_offsets
from shardkit.format.spec import (
    IMAGE_MEMBER_EXTENSIONS,
    INDEX_NAME,
    PACK_STATE_DIR,
    SHARD_SUFFIX,
    check_key,
    offsets_name,
)
from shardkit.format.tarread import TarEntry, group_spans, iter_entries, sample_key
from shardkit.format.tarwrite import SampleSpan
from shardkit.index._hashing import HashingReader
from shardkit.index.folder import shards_left_out, why_no_shards
from shardkit.index.manifest import Manifest, ShardEntry
from shardkit.index.manifest_io import unfinished_pack, write_manifest
from shardkit.index.member_checks import Oddities, check_unused_run, not_as_named
from shardkit.index.sample_fields import caption_problem, kind_of, label_of, not_one_image
from shardkit.storage import Store

log = logging.getLogger("shardkit.index")

#: The largest label ``shardkit index`` accepts: the class list it writes holds every label up to the
#: largest one (a shard claiming label 100000000 must not make it build a list of 10**8 names).
MAX_INFERRED_CLASSES = 1 << 20


@dataclass
class _Shard:
    entry: ShardEntry
    spans: list[SampleSpan]
    entries: list[TarEntry]


def _read_shard(store: Store, url: str, keys: dict[str, str], labels: dict[int, str | None], limit: int,
                kind: list[str], odd: Oddities, first_at: dict[int, str], *, with_classes: bool = False) -> _Shard:
    where = store.path(url)
    with store.open_read(url) as f:
        reader = HashingReader(f, keep=True)
        stream = io.BufferedReader(reader, 1 << 20)
        entries: list[TarEntry] = []
        samples: dict[str, dict[str, bytes]] = {}
        crcs: dict[int, int] = {}  # each run of members with one key: its CRC-32, by its first offset
        start = folded = 0  # the current run's first offset (its CRC-32 so far: crcs[start]), and how far it goes
        current: str | None = None
        for e in iter_entries(stream, where=where):
            key, ext = sample_key(e.name, where=where)
            if key != current:  # a run starts where the previous one ended
                if key in samples:
                    raise FormatError(f"sample {key!r} is split across the shard (a member of it at byte "
                                      f"{e.offset} follows other samples; a sample's members must be consecutive)",
                                      where=where)
                current, start, folded, crcs[e.offset] = key, e.offset, e.offset, 0
            # a run's span is every byte from its first member's headers to its last one's padding (a
            # global header or folder entry between its members too): folded in member by member, so
            # nothing read before is kept
            crcs[start] = reader.crc32(folded, e.end, crcs[start])
            folded = e.end
            reader.release(folded)
            if key not in samples:  # before the order is judged: `tar -C dir .` names every member ./...
                _check_key(key, where=f"{where}:{key}")
            fields = samples.setdefault(key, {})
            if ext in fields:
                raise FormatError(f"sample {key!r} has field {ext!r} twice", where=where)
            if ext in IMAGE_MEMBER_EXTENSIONS and (odd_one := not_as_named(ext, e.data or b"")) is not None:
                decodes, why = odd_one
                odd.add("misnamed" if decodes else "not_image", f"{where}:{key}.{ext}: {why}")
            # keep labels, not images
            fields[ext] = (e.data or b"") if ext in ("cls", "json", "txt") else b""
            entries.append(e._replace(data=None))
        while stream.read(1 << 20):  # hash the trailing padding too
            reader.release(reader.count)
    spans = [SampleSpan(k, o, n, crcs[o]) for k, o, n in group_spans(iter(entries), where=where)]
    mine: set[str] = set()  # joins ``keys`` once the shard reads, so that a refused one names no other
    for span in spans:
        fields = samples[span.key]
        _check_key(span.key, where=f"{where}:{span.key}")
        if span.key in mine:
            raise FormatError(f"sample key {span.key!r} appears twice in the shard", where=where)
        if span.key in keys:
            raise FormatError(f"sample key {span.key!r} is also a sample of {keys[span.key]}: keys must be unique "
                              "in a dataset (shards written by two runs that each numbered keys from 0?); write them "
                              "with distinct keys, or index each run's shards in a folder of its own and mix the "
                              "datasets (ShardLoader([a, b]))", where=where)
        mine.add(span.key)
        images = sorted(ext for ext in fields if ext in IMAGE_MEMBER_EXTENSIONS)
        if len(images) != 1:
            raise FormatError(not_one_image(span.key, fields), where=f"{where}:{span.key}")
        odd.image_names[images[0]] += 1
        if kind[0] == "auto":
            kind[0] = kind_of(fields)
            if kind[0] == "captions" and with_classes:  # a class list given for captioned shards
                raise FormatError("this first sample has a txt member and no cls: the shards hold captioned "
                                  "images, which class names do not apply to (index them without a class list, "
                                  "or give every sample a cls member)", where=f"{where}:{span.key}")
        if kind[0] == "captions":
            if (problem := caption_problem(span.key, fields, where)) is not None:
                odd.add(*problem)
            continue
        label, name = label_of(span.key, fields, where, limit)
        if name is not None and labels.get(label) not in (None, name):
            raise FormatError(f"label {label} is class {name!r} here but {labels[label]!r} "
                              "elsewhere",
                              where=f"{where}:{span.key}")
        labels[label] = name if name is not None else labels.get(label)
        first_at.setdefault(label, f"{where}:{span.key}")
    keys.update(dict.fromkeys(mine, where))
    return _Shard(ShardEntry(url, len(spans), reader.count, reader.hash.hexdigest()), spans,
                  entries)


#: Shards with a problem after which ``shardkit index`` stops reading and lists them.
MAX_LISTED_PROBLEMS = 20


def _refusal(problems: list[FormatError], *, read: int, total: int, where: str) -> FormatError:
    """One shard's problem as it is; several as one error listing each shard's first, so that a
    user fixes them all before the next run (reading stopped at :data:`MAX_LISTED_PROBLEMS`)."""
    if len(problems) == 1:
        return problems[0]
    stopped = f"; stopped reading after {read:,} of the {total:,} shards" if read < total else ""
    listed = "".join(f"\n  - {err}" for err in problems)
    return FormatError(f"{len(problems):,} of the {read:,} shards read cannot be indexed as they are (the first "
                       f"problem of each){stopped}:{listed}", where=where)


def _classes(labels: dict[int, str | None], names: Sequence[str] | None,
             where: str, first_at: dict[int, str]) -> tuple[str, ...]:
    """The class names: ``names`` as given (checked against the labels found, an error naming the
    first sample with the label at fault, ``SHARD:KEY``), or those the shards' json gave."""
    top = max(labels, default=-1)
    if names is not None:
        if top >= len(names):
            raise FormatError(f"label {top} is out of range for the {len(names)} class names given (labels run "
                              f"from 0 to {len(names) - 1})", where=first_at.get(top, where))
        for label, name in labels.items():
            if name is not None and names[label] != name:
                raise FormatError(f"label {label} is {name!r} in the shards' json but "
                                  f"{names[label]!r} in the class names given", where=first_at.get(label, where))
        return tuple(names)
    inferred = tuple(labels.get(i) or str(i) for i in range(top + 1))
    if len(labels) < top + 1:  # labels no sample has: the class list holds them all, to keep labels = indices
        absent = [i for i in range(top + 1) if i not in labels]
        log.warning("shardkit: labels run from 0 to %d, but %s of them label no sample (%s): the class list holds "
                    "all %s (a mistyped label? label %d is first at %s); pass --classes FILE to name the classes",
                    top, f"{len(absent):,}", ", ".join(map(str, absent[:5])) + (", …" if len(absent) > 5 else ""),
                    f"{top + 1:,}", top, first_at.get(top, where))
    named: dict[str, int] = {}
    for label, name in enumerate(inferred):
        if labels.get(label) is None:  # no json names it: its number stands in, as before
            continue
        if name in named:  # as --classes refuses a name twice: a label's class is its name
            raise FormatError(f"labels {named[name]} and {label} are both {name!r} in the shards' json (at "
                              f"{first_at.get(named[name], '?')} and here): class names must differ; pass --classes "
                              "FILE naming the classes in label order", where=first_at.get(label, where))
        named[name] = label
    return inferred


def _check_class_names(classes: Sequence[str]) -> None:
    """Class names as labels need them: each a non-empty string, no two alike (label = index)."""
    seen: dict[str, int] = {}
    for label, name in enumerate(classes):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"class name of label {label} is {name!r}: each label needs a non-empty name")
        if name in seen:
            raise ValueError(f"class {name!r} is named for labels {seen[name]} and {label}: class names must "
                             "differ (a label's class is its name)")
        seen[name] = label


def _check_offsets_slot(store: Store, url: str, overwrite: bool) -> None:
    """Refuse to overwrite an ``.idx`` beside a shard that is not a shardkit offsets file
    (e.g. DALI's ``wds2idx`` output under its default name) unless ``overwrite``."""
    idx = offsets_name(url)
    raw = store.read_optional(idx)
    if raw is None or overwrite:
        return
    try:
        load_offsets(raw, where=store.path(idx))
    except FormatError as err:
        raise ManifestError("exists and is not a shardkit offsets file (a DALI index from "
                            f"wds2idx?); move it aside or pass --overwrite ({err.message})",
                            where=store.path(idx)) from err


def _before_replacing_a_pack(store: Store) -> None:
    """Refuse to index a COCO pack again (its samples have no label this indexes), and say what
    indexing a pack again replaces: ``shardkit pack``'s record of its options and skipped inputs.

    Raises:
        ManifestError: the ``index.json`` there is a COCO pack's.
    """
    try:
        doc = parse_json(store.read_bytes(INDEX_NAME))
    except Exception:  # an unreadable index.json is what --overwrite replaces
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("options"), dict) or "fingerprint" not in doc["options"]:
        return
    if doc.get("kind") == "coco":
        raise ManifestError("holds a COCO pack made by shardkit pack: shardkit index takes labelled or captioned "
                            "shards, not COCO's (`shardkit verify` checks this pack; `shardkit pack ... --overwrite` "
                            "makes it again)", where=store.path(INDEX_NAME))
    log.warning("shardkit: %s was written by shardkit pack: indexing again replaces its record of the pack's options "
                "and skipped inputs, and the pack command that made it will then refuse this folder",
                store.path(INDEX_NAME))


def adopt_shards(
    url: str,
    *,
    classes: Sequence[str] | None = None,
    kind: str = "auto",
    dali_index: bool = False,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Manifest:
    """Index the WebDataset shards (``*.tar``, in name order) under ``url`` as a shardkit dataset.

    Each sample needs exactly one image member (any extension in
    :data:`~shardkit.format.spec.IMAGE_MEMBER_EXTENSIONS`) and a ``cls`` member (decimal label);
    ``json`` is optional. Class names come from ``classes`` (index = label), else from a ``json``
    member's ``class`` field when samples have one, else they are the labels as text.

    ``kind="captions"`` indexes image-text shards (img2dataset's output): each sample needs one
    image member and a ``txt`` member (the caption, UTF-8: one that is not is indexed all the same,
    with one warning for them all, and the loader replaces such samples); ``json`` is optional and
    every other member is kept. ``"auto"`` (the default) takes the kind from the first sample: captioned when
    it has ``txt`` and no ``cls`` (refused, naming that sample, where ``classes`` is given), else labelled.
    Writes ``<shard>.idx`` offsets files, with ``dali_index`` also ``<shard>.dali.idx``
    (:mod:`shardkit.format.dali_index`), and ``index.json`` last. Shards are not modified.

    Example::

        manifest = adopt_shards("wds_out/", classes=["cat", "dog"], dali_index=True)

    Raises:
        ManifestError: ``url`` already holds ``index.json`` (unless ``overwrite``), an ``.idx``
            beside a shard is not ours (unless ``overwrite``), there are no ``.tar`` files, or
            they are those of a ``shardkit pack`` that did not finish.
        FormatError: a shard is not a readable tar file, or a sample lacks an image or label, has
            an invalid or duplicate key (names shard and sample).
    """
    store = Store(url, storage_options)
    if store.exists(INDEX_NAME):
        if not overwrite:
            raise ManifestError("already has index.json (pass --overwrite to index the shards again)",
                                where=store.path(INDEX_NAME))
        _before_replacing_a_pack(store)
    listed = store.listdir()
    names = [n for n in listed if not n.startswith(".")]
    urls = [n for n in names if n.endswith(SHARD_SUFFIX)]
    if PACK_STATE_DIR in listed and INDEX_NAME not in listed:  # its shards are part of the source only
        raise ManifestError(f"holds {unfinished_pack(len(urls))}; indexed now, it would be a dataset of that part of "
                            f"its source only (to index these shards as they are, remove {PACK_STATE_DIR}/ first)",
                            where=store.url)
    if not urls and not store.remote and not os.path.isdir(store.path("")):
        what = "is a file, not a directory of .tar shards" if os.path.exists(store.path("")) else "does not exist"
        raise ManifestError(what, where=store.url)
    if not urls:
        if store.remote and not names and not store.exists(""):  # an empty listing: nothing there, or no folder
            raise ManifestError("does not exist", where=store.url)
        raise ManifestError(f"no .tar shards here to index{why_no_shards(store, names)}", where=store.url)
    if urls:
        refusal, warning = shards_left_out([n for n in names if store.remote or not os.path.isdir(store.path(n))],
                                            urls)
        if refusal is not None:
            raise ManifestError(refusal, where=store.url)
        if warning is not None:
            log.warning("shardkit: %s: %s", store.url, warning)
    for name in urls:
        _check_offsets_slot(store, name, overwrite)
    if kind not in ("auto", "imagefolder", "captions"):
        raise ValueError(f"kind must be 'auto', 'imagefolder' or 'captions', not {kind!r}")
    if kind == "captions" and classes is not None:
        raise ValueError("classes apply to labelled images, not to captioned ones")
    if classes is not None:
        _check_class_names(classes)
    keys: dict[str, str] = {}  # every key read so far -> its shard
    labels: dict[int, str | None] = {}
    first_at: dict[int, str] = {}  # label -> the first sample with it
    limit = max(MAX_INFERRED_CLASSES, len(classes or ()))
    found = [kind]  # "auto": the first sample's kind
    odd = Oddities()
    shards: list[_Shard] = []
    problems: list[FormatError] = []  # the first of each shard's, so that one run lists them all
    for name in urls:
        try:
            shards.append(_read_shard(store, name, keys, labels, limit, found, odd, first_at,
                                      with_classes=classes is not None))
        except FormatError as err:
            problems.append(err)
            if len(problems) == MAX_LISTED_PROBLEMS:
                break
    if problems:
        raise _refusal(problems, read=len(shards) + len(problems), total=len(urls), where=store.url)
    odd.say()
    if found[0] == "auto":
        raise ManifestError("the .tar shards here hold no sample to index", where=store.url)
    if found[0] == "imagefolder" and classes is None:
        check_unused_run(labels, first_at)
    class_names = _classes(labels, classes, store.url, first_at) if found[0] == "imagefolder" else None
    for shard in shards:
        store.write_bytes(offsets_name(shard.entry.url), dump_offsets(shard.spans))  # an empty shard's too
        if dali_index:
            store.write_bytes(dali_index_name(shard.entry.url),
                              dump_dali_index(shard.entries, where=store.path(shard.entry.url)))
    from shardkit._version import __version__

    manifest = Manifest(
        kind=found[0],
        shards=tuple(s.entry for s in shards),
        classes=class_names,
        options={"dali_index": dali_index},
        created_by=f"shardkit {__version__} (index)",
        adopted=True,
    )
    write_manifest(store, manifest)
    return manifest


def _check_key(key: str, *, where: str) -> None:
    """:func:`~shardkit.format.spec.check_key`, saying how to tar files so that their names are
    keys where a member lies in a folder (``tar -C DIR .`` names every one ``./...``)."""
    try:
        check_key(key, where=where)
    except FormatError as err:
        if "/" not in key:
            raise
        raise FormatError(f"{err.message}: its members lie in a folder; tar the files from inside it "
                          "as docs/guides/interop.md says: (cd DIR && ls | LC_ALL=C sort | tar -cf "
                          "../shard-000000.tar -T -); from webdataset's ShardWriter, write each __key__ "
                          "without a '/'", where=where) from None
