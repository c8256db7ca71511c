"""The state of DST before a pack: fresh, resumable, already complete, or someone else's."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from shardkit.errors import PackError, ShardkitError
from shardkit.format.dali_index import DALI_INDEX_SUFFIX, dali_index_name
from shardkit.format.spec import HASHES_NAME, INDEX_NAME, OFFSETS_SUFFIX, PACK_STATE_DIR, TABLE_NAME, is_shard_name
from shardkit.index.manifest import Manifest
from shardkit.index.manifest_io import read_manifest
from shardkit.pack.plan import ShardPlan
from shardkit.pack.write import REPLACEMENT_DIR, ShardReceipt, receipt_name
from shardkit.sources.base import SourceListing
from shardkit.sources.coco import DROP_EMPTY
from shardkit.storage import Store

_PLAN_NAME = "plan.json"


class DestinationInUse(PackError):
    """DST holds what a pack replaces only when told to (``--overwrite``): :attr:`what` says what
    it holds, the message adds what to do."""

    def __init__(self, what: str, remedy: str, *, where: str) -> None:
        super().__init__(f"{what}; {remedy}", where=where)
        self.what, self.remedy = what, remedy

    def __reduce__(self) -> tuple[Any, ...]:
        return _destination_in_use, (self.what, self.remedy, self.where)


def _destination_in_use(what: str, remedy: str, where: str) -> DestinationInUse:
    return DestinationInUse(what, remedy, where=where)


def fingerprint(listing: SourceListing, recorded_options: dict[str, Any]) -> str:
    """A hash of everything that determines the output bytes (not the worker count), recorded
    in ``index.json``.

    It describes the input, not where it is read from: no path prefix, modification time or
    ETag, so the same tree packed from disk or from a bucket gives the same ``index.json``.
    Changes to the files since an unfinished pack began are caught by :func:`input_versions`.
    """
    h = hashlib.sha256()
    head = {"kind": listing.kind, "classes": listing.classes, "categories": listing.categories,
            "extra": listing.extra, "options": recorded_options}
    h.update(json.dumps(head, sort_keys=True).encode())
    h.update(str(listing.meta_digest).encode())
    for s in listing.samples:
        meta = None if listing.meta_digest is not None else s.meta
        row = [s.rel, s.size, s.label, meta] if s.caption is None else [s.rel, s.size, s.label, meta, s.caption]
        h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()


#: Options that change no byte where their condition holds: ``quality`` without ``resize_max``
#: (nothing is re-encoded), ``seed`` without ``shuffle``. A pack records them all the same.
_INERT = {"quality": lambda o: o.get("resize_max") is None, "seed": lambda o: o.get("shuffle") is False}


def recorded_plan(store: Store) -> dict[str, Any] | None:
    """What the unfinished pack in ``store`` recorded when it began (``fingerprint``, ``versions``,
    ``options``, ``kind``), or None: none recorded, or not readable as such."""
    try:
        raw = store.read_optional(f"{PACK_STATE_DIR}/{_PLAN_NAME}")
        plan = json.loads(raw) if raw is not None and len(raw) < 1 << 20 else None
    except (ValueError, OSError, ShardkitError):
        return None
    return plan if isinstance(plan, dict) else None


def with_recorded_inert_options(recorded: dict[str, Any], store: Store) -> dict[str, Any]:
    """``recorded`` with the inert options (see :data:`_INERT`) of the pack already in ``store``
    (finished, or unfinished with its options recorded): a pack made when such a value was taken
    (``--quality 50`` without ``--resize-max``) is resumed and found complete by the same command
    without it, since those options change nothing. DST's own problems are said where it is
    prepared, not here."""
    before: Any = None
    try:
        if store.exists(INDEX_NAME):
            before = read_manifest(store).options  # bounded, as the check of DST reads it
        else:
            before = (recorded_plan(store) or {}).get("options")
    except (ValueError, OSError, ShardkitError):
        before = None
    if not isinstance(before, dict):
        return recorded
    out = dict(recorded)
    for key, inert in _INERT.items():
        if key in before and inert(recorded) and inert(before):
            out[key] = before[key]
    return out


def input_versions(listing: SourceListing) -> str:
    """A hash of the input files' versions (modification times, ETags), recorded in the pack
    state only: an unfinished pack does not resume over files changed since it began."""
    h = hashlib.sha256()
    for s in listing.samples:
        h.update(json.dumps([s.rel, s.version]).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class DestinationState:
    """``complete``: DST already holds this exact dataset. ``receipts``: shards reusable now."""

    complete: Manifest | None
    receipts: dict[int, ShardReceipt]


def is_temporary(name: str) -> bool:
    return name.startswith(".") and ".tmp-" in name


def is_ours(name: str) -> bool:
    """Whether DST's entry ``name`` is a pack's: its index files, state, shards, the offsets and
    DALI index files beside them, or a writer's temporary."""
    if name.endswith(DALI_INDEX_SUFFIX):
        return is_shard_name(name[: -len(DALI_INDEX_SUFFIX)] + ".tar")
    return name in (INDEX_NAME, TABLE_NAME, HASHES_NAME, PACK_STATE_DIR) or is_shard_name(name) or (
        name.endswith(OFFSETS_SUFFIX) and is_shard_name(name[: -len(OFFSETS_SUFFIX)] + ".tar")
    ) or is_temporary(name)


def clear_destination(store: Store) -> None:
    """Remove a previous pack's files (index first, so DST stops being a dataset at once)."""
    store.remove(INDEX_NAME)
    for name in store.listdir():
        if is_ours(name):
            store.remove(name)


def _reusable(store: Store, plans: list[ShardPlan], *, coco: bool = False) -> dict[int, ShardReceipt]:
    """The receipts of the shards of ``plans`` already written whole. ``coco``: a COCO pack, whose
    receipts must record its images' sizes (receipts of an earlier shardkit do not: their shards
    are written again, so that the annotation report is made at the images' sizes)."""
    state = store.child(PACK_STATE_DIR)
    done = set(state.listdir())
    sizes = store.file_sizes()  # one listing, not a request per shard
    receipts = {}
    for plan in plans:
        if receipt_name(plan) in done and plan.name in sizes:
            raw = state.read_bytes(receipt_name(plan))
            if coco and b'"image_sizes"' not in raw:
                continue
            receipt = ShardReceipt.from_json(raw)
            if receipt.name == plan.name and sizes[plan.name] == receipt.num_bytes:
                receipts[plan.index] = receipt
    return receipts


def prepare_destination(store: Store, fp: str, plans: list[ShardPlan], *, overwrite: bool,
                        versions: str, options: dict[str, Any] | None = None,
                        listing: SourceListing | None = None) -> DestinationState:
    """Decide what to do with DST and leave it ready for writing. ``fp``: the
    :func:`fingerprint`; ``versions``: the :func:`input_versions`; ``options``: the pack's
    recorded options, and ``listing`` its source (what a refusal names when DST holds a pack
    made with others).

    Raises:
        PackError: DST holds something else (another dataset, another unfinished pack, the
            same pack begun on input files that changed since, or unrelated files) and
            ``overwrite`` is false. Nothing is touched then.
    """
    source = None if listing is None else (listing.kind, DROP_EMPTY in listing.extra)
    # what a later refusal names when another command finds this pack unfinished
    plan = json.dumps({"fingerprint": fp, "versions": versions, "options": options,
                       "kind": None if source is None else list(source)}).encode()
    entries = store.listdir()
    if overwrite and entries:
        clear_destination(store)
        entries = [e for e in store.listdir() if is_ours(e)]  # unrelated files may stay
    if INDEX_NAME in entries:
        manifest = read_manifest(store)
        if manifest.options.get("fingerprint") == fp:
            _check_shards(store, manifest, entries)
            # Killed after index.json was written but before the clean-up: finish it now.
            _drop_leftovers(store, entries)
            return DestinationState(manifest, {})
        packed = (manifest.kind, DROP_EMPTY in manifest.extra)
        differs = _difference(manifest.options, options, packed, source)
        changed = {k for k in set(manifest.options) | set(options or {})
                   if k != "fingerprint" and manifest.options.get(k) != (options or {}).get(k)}
        if changed == {"dali_index"} and (options or {}).get("dali_index"):  # the same pack, DALI's files wanted
            same = listing is not None and manifest.options.get("fingerprint") == fingerprint(
                listing, {**(options or {}), "dali_index": False})  # the same input too
            if same and all(dali_index_name(shard.url) in entries for shard in manifest.shards):
                _check_shards(store, manifest, entries)  # `shardkit index --dali-index` added them: complete
                return DestinationState(manifest, {})
            raise DestinationInUse(f"holds this pack without DALI index files ({differs})",
                                   f"`shardkit index {store.url} --dali-index` adds them without packing again "
                                   "(or pass --overwrite to pack again)", where=store.url)
        raise DestinationInUse(f"holds a different packed dataset ({differs})", "pass --overwrite to replace it",
                               where=store.url)
    if REPLACEMENT_DIR in entries:
        raise DestinationInUse("holds a pack replacement (--overwrite) that was interrupted as it took the old "
                               "pack's place", "re-run the command that began it, with --overwrite, to finish it",
                               where=store.url)
    if PACK_STATE_DIR in entries:
        state = store.child(PACK_STATE_DIR)
        # No plan: killed before it was recorded, so before any shard was written. Take it over.
        previous = (json.loads(state.read_bytes(_PLAN_NAME)) if state.exists(_PLAN_NAME)
                    else {"fingerprint": fp, "versions": versions})
        if previous.get("fingerprint") != fp:
            before, kind = previous.get("options"), previous.get("kind")
            differs = ("different input or options" if not isinstance(before, dict) or not isinstance(kind, list)
                       else _difference(before, options, (kind[0], bool(kind[1])), source))
            raise DestinationInUse(f"holds an unfinished pack of {differs}" if differs.startswith("different")
                                   else f"holds an unfinished pack ({differs.replace('packed with', 'begun with', 1)})",
                                   "re-run that command to resume it, or pass --overwrite to start over",
                                   where=store.url)
        if previous.get("versions") != versions:
            raise DestinationInUse("holds an unfinished pack of this input, but input files changed since it "
                                   "began (modification times or ETags differ)", "pass --overwrite to start over",
                                   where=store.url)
        for name in entries:
            if is_temporary(name):  # left by a killed writer; its shard is rewritten below
                store.remove(name)
        if not state.exists(_PLAN_NAME):
            state.write_bytes(_PLAN_NAME, plan)
        return DestinationState(None, _reusable(store, plans, coco=source is not None and source[0] == "coco"))
    if entries:
        count = f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}"
        raise DestinationInUse(f"is not empty ({count}, e.g. {entries[0]!r})",
                               "pack into an empty or new directory, or pass --overwrite", where=store.url)
    store.makedirs()
    state = store.child(PACK_STATE_DIR)
    state.makedirs()
    state.write_bytes(_PLAN_NAME, plan)
    return DestinationState(None, {})


def _difference(before: dict[str, Any], now: dict[str, Any] | None, packed: tuple[str, bool] = ("", False),
                source: tuple[str, bool] | None = None) -> str:
    """What differs between a finished pack's recorded options and this one's, for a refusal;
    ``packed`` and ``source``: the pack's and this source's kind, and whether each left out
    COCO images without annotations (``--drop-empty``, which a pack records in ``index.json``;
    packs made before it was recorded have no record, so a missing one is not said as "without").

    Example:
        >>> _difference({"max_count": 64, "seed": 0, "fingerprint": "a"}, {"max_count": 1000, "seed": 0})
        'packed with max_count=64, now 1000'
        >>> _difference({"max_count": 64, "fingerprint": "a"}, {"max_count": 64}, ("imagefolder", False),
        ...             ("imagefolder", False))
        'same options, other input: its files or their order differ'
        >>> _difference({"seed": 0, "fingerprint": "a"}, {"seed": 3}, ("coco", True), ("coco", False))
        'packed with seed=0, now 3; --drop-empty, now without'
        >>> _difference({"seed": 0, "fingerprint": "a"}, {"seed": 3}, ("coco", False), ("imagefolder", False))
        'packed with seed=0, now 3; the pack there is of kind coco, this source of kind imagefolder'
    """
    if now is None:
        return "other input or options"
    changed = [f"{k}={before.get(k)!r}, now {now.get(k)!r}" for k in sorted(set(before) | set(now))
               if k != "fingerprint" and before.get(k) != now.get(k)]
    if source is not None and packed[0] == source[0] == "coco" and packed[1] != source[1]:
        if packed[1]:
            changed.append("--drop-empty, now without")
        else:
            unrecorded = "this run has --drop-empty, which the pack there does not record"
            return "packed with " + "; ".join(changed) + "; " + unrecorded if changed else unrecorded
    other_kind = (f"the pack there is of kind {packed[0]}, this source of kind {source[0]}"
                  if source is not None and source[0] != packed[0] else "")
    if changed:
        return "packed with " + "; ".join(changed) + (f"; {other_kind}" if other_kind else "")
    if source is None:
        return "same options, other input: source files, annotations, their order or --drop-empty differ"
    if other_kind:
        return f"same options, other input: {other_kind}"
    what = {"coco": "its files, annotations or their order",
            "captions": "its files, captions or their order"}.get(source[0], "its files or their order")
    return f"same options, other input: {what} differ"


def _check_shards(store: Store, manifest: Manifest, entries: list[str]) -> None:
    """Before calling a finished pack complete: every shard its index names is there (and, on a
    local disk, of the recorded size; ``shardkit verify`` checks the contents).

    Raises:
        PackError: naming the first damaged shards, with the way out.
    """
    present = set(entries)
    damaged = []
    for shard in manifest.shards:
        if shard.url not in present:
            damaged.append(f"{shard.url} is missing")
        elif not store.remote and (size := store.size(shard.url)) != shard.num_bytes:
            damaged.append(f"{shard.url} has {size:,} bytes, index.json says {shard.num_bytes:,}")
    if damaged:
        more = f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else ""
        raise PackError(f"holds this pack, damaged: {'; '.join(damaged[:3])}{more}; pass --overwrite to pack it "
                        "again", where=store.url)


def _drop_leftovers(store: Store, entries: list[str]) -> None:
    """Remove the pack state and writers' temporaries from a finished DST (``entries``)."""
    for name in entries:
        if name == PACK_STATE_DIR or is_temporary(name):
            store.remove(name)


def finish_destination(store: Store) -> None:
    """Drop the pack state once ``index.json`` is written (and any temporary a worker killed
    with its pack left, e.g. when the pack stopped on a skip budget and was re-run)."""
    _drop_leftovers(store, store.listdir())
