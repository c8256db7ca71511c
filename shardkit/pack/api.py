"""``pack()``: list a source, plan shards, write them in parallel, write ``index.json`` last."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import BrokenExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from shardkit.errors import PackError, ShardkitError, SourceError, StorageError
from shardkit.format.dali_index import dali_index_name
from shardkit.format.spec import key_width, normalize_extension, offsets_name
from shardkit.index.manifest import Manifest, ShardEntry
from shardkit.index.manifest_io import write_manifest
from shardkit.machine import usable_cores
from shardkit.pack import ray_exec
from shardkit.pack.annotations import ANNOTATION_REPORT, annotation_report
from shardkit.pack.lock import destination_lock
from shardkit.pack.options import PackOptions
from shardkit.pack.plan import plan_shards
from shardkit.pack.pool import exit_if_reentered, run_local
from shardkit.pack.progress import PackProgress, Progress, as_pack_progress, input_bytes
from shardkit.pack.replace import (
    discard_replacement,
    publish_replacement,
    replacement_fingerprint,
    replacement_stage,
)
from shardkit.pack.resume import (
    DestinationInUse,
    clear_destination,
    fingerprint,
    finish_destination,
    input_versions,
    prepare_destination,
    with_recorded_inert_options,
)
from shardkit.pack.skips import SkipBudget, check_budget
from shardkit.pack.write import REPLACEMENT_DIR, ShardReceipt, ShardTask
from shardkit.sources.base import SourceListing, SourceSample
from shardkit.storage import Store, within

Executor = Literal["processes", "ray"]
"""Where shards are written: a local process pool, or Ray tasks (see
:mod:`shardkit.pack.ray_exec`)."""


@dataclass(frozen=True)
class PackResult:
    """Summary of a pack run. ``reused_shards``: shards kept from an interrupted earlier run
    (``reused_samples``: their samples); ``ray_nodes``: shards this run wrote on each Ray node (by
    node id; empty without Ray)."""

    url: str
    manifest: Manifest
    seconds: float
    reused_shards: int
    already_complete: bool
    ray_nodes: dict[str, int] = field(default_factory=dict)
    reused_samples: int = 0

    @property
    def images_per_second(self) -> float:
        """Samples this run packed (not those of reused shards) per second."""
        written = self.manifest.num_samples - self.reused_samples
        return written / self.seconds if self.seconds > 0 else 0.0


def _check_outside_source(src: str, dst: str) -> None:
    """Refuse a DST at or below SRC: the shards would join the tree they are packed from (and
    the next pack of it would find a class folder of shards).

    Raises:
        PackError: naming both.
    """
    if within(dst, src):
        raise PackError(f"is inside the source {src}: the shards would become part of the tree they are "
                        "packed from; pack into a directory outside it", where=dst)


log = logging.getLogger("shardkit.pack")


def mixed_image_formats(listing: SourceListing, skipped: Iterable[str] = ()) -> Counter[str]:
    """Image members per extension when the samples of ``listing`` packed hold more than one kind
    (else empty): such a pack without ``uniform_names`` names its members ``.jpg``, ``.png``, ...
    per sample. ``skipped``: the ``source`` of each sample the writers skipped (one entry per
    sample: a caption table may list one file twice).

    >>> from shardkit.sources.sample import SourceSample
    >>> listing = SourceListing("imagefolder", "/d", [SourceSample("a.JPEG", "a.JPEG", 1),
    ...                                               SourceSample("b.png", "b.png", 1)])
    >>> mixed_image_formats(listing)
    Counter({'jpg': 1, 'png': 1})
    >>> mixed_image_formats(listing, skipped=["b.png"])
    Counter()
    """
    counts = Counter(normalize_extension(posixpath.splitext(s.rel)[1]) for s in _packed(listing, skipped))
    return counts if len(counts) > 1 else Counter()


def _packed(listing: SourceListing, skipped: Iterable[str]) -> Iterator[SourceSample]:
    """The samples of ``listing`` the writers packed: all but one per entry of ``skipped`` (the
    ``source`` of each skipped sample; a caption table may list one file twice)."""
    left_out = Counter(skipped)
    for s in listing.samples:
        if left_out[s.rel] > 0:
            left_out[s.rel] -= 1
        else:
            yield s


def _warn_mixed_formats(listing: SourceListing, options: PackOptions, receipts: list[ShardReceipt]) -> None:
    """Say, once a pack is done, that a mixed-format set packed without uniform names loses samples
    in readers that take their columns from the first samples (HF datasets gives ``None`` images),
    counting the image members the shards hold (named by their bytes: a PNG named ``.jpg`` is a
    ``png`` member); where a receipt of an earlier shardkit did not count them, by the names of
    the source files packed (:func:`mixed_image_formats`)."""
    if options.uniform_names:
        return
    counts: Counter[str] = Counter()
    if any(r.image_formats is None for r in receipts):  # a receipt of an earlier shardkit: by file names
        counts = mixed_image_formats(listing, (s["source"] for r in receipts for s in r.skipped))
    else:
        for r in receipts:
            counts.update(r.image_formats or {})
    if len(counts) < 2:
        return
    (common, _), *rest = counts.most_common()
    minority = ", ".join(f"{n:,} {ext}" for ext, n in rest)
    log.warning(MIXED_FORMATS, f"{sum(counts.values()):,}", f"{counts[common]:,} {common}", minority, common, "jpg")


def _warn_emptied_classes(listing: SourceListing, skipped: Iterable[str]) -> None:
    """Say which classes hold no sample because every input of theirs was skipped (``skipped``:
    their ``source``s): each keeps its label, as torchvision's ``ImageFolder`` keeps it."""
    if listing.classes is None:
        return
    listed, packed = Counter(s.label for s in listing.samples), Counter(s.label for s in _packed(listing, skipped))
    emptied = [label for label in sorted(k for k in listed if k is not None) if not packed[label]]
    if len(emptied) == 1:
        (k,) = emptied
        log.warning("shardkit: class %r holds no sample: its %s were all skipped; it keeps its label, as in "
                    "ImageFolder", listing.classes[k], "input" if listed[k] == 1 else f"{listed[k]:,} inputs")
    elif emptied:
        named = ", ".join(f"{listing.classes[k]!r} ({listed[k]:,})" for k in emptied[:5])
        more = f" and {len(emptied) - 5:,} more" if len(emptied) > 5 else ""
        log.warning("shardkit: %d classes hold no sample, their inputs all skipped: %s%s; each keeps its label, as "
                    "in ImageFolder", len(emptied), named, more)


#: The warning of a mixed-format set packed without uniform names (``shardkit bench``, whose own
#: loaders read every member, leaves it out of the packs it makes for them).
MIXED_FORMATS = ("shardkit: %s images are %s and %s: HF datasets' webdataset loader and webdataset's "
                 "to_tuple(%r) give those samples no image (None, or a skipped sample); pack with "
                 "--uniform-names (PackOptions(uniform_names=True)) to name every image member .%s")


def pack_listing(
    listing: SourceListing,
    dst: str,
    *,
    options: PackOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | PackProgress | None = None,
    executor: Executor = "processes",
    ray_address: str | None = None,
    max_skipped: SkipBudget | None = None,
) -> PackResult:
    """Pack the samples of ``listing`` into shards under ``dst`` (a path or fsspec URL).

    Same listing and options give byte-identical shards and index for any ``workers`` and either
    ``executor``. A run interrupted at any point (even ``kill -9``) resumes when called again,
    with either executor: complete shards are kept, the rest rewritten. See
    :func:`shardkit.pack.pack` for the arguments.

    ``max_skipped`` bounds the inputs that may be skipped (unpackable files, and for COCO image
    records that cannot be packed); more fail the pack as soon as that is known, before
    ``index.json`` is written. It is policy, not output: it is not recorded and does not stop a
    re-run with another budget from resuming. A pack that would publish no sample always fails.

    Raises:
        ValueError: ``executor`` is not ``"processes"`` or ``"ray"``, or ``ray_address`` is given
            without ``executor="ray"``.
        SourceError: the listing holds no sample (nothing to pack); DST is not touched.
        SkipBudgetError: more inputs skipped than ``max_skipped`` allows, or none packed. Shards
            already complete stay (with their receipts) so that a re-run resumes.
    """
    exit_if_reentered()  # a spawned writer importing a script that calls this at its top level
    if executor not in ("processes", "ray"):
        raise ValueError(f"executor must be 'processes' or 'ray', not {executor!r}")
    if ray_address is not None and executor != "ray":
        raise ValueError("ray_address needs executor='ray'")
    options = options or PackOptions()
    total = len(listing.samples) + len(listing.warnings)
    if not listing.samples:
        first = min(listing.warnings, key=_natural) if listing.warnings else None  # paths in order, rows by number
        unpacked = (f" ({len(listing.warnings)} image record(s) not packable; the first, {first['source']}: "
                    f"{first['reason']})" if first is not None else "")
        dropped = (listing.extra.get("drop_empty") or {}).get("images", 0)
        if dropped:  # every image left out by --drop-empty: say so, not "no sample"
            unpacked += f"; --drop-empty left out all {dropped} images, none has an annotation"
        raise SourceError(f"nothing to pack: the source lists no sample{unpacked}",
                          where=listing.root)
    check_budget(list(listing.warnings), total, max_skipped, where=dst, finished=False)
    _check_outside_source(listing.root, dst)
    started = time.perf_counter()
    store = Store(dst, storage_options)
    if executor == "ray":  # refused before DST is touched
        ray_exec.check_ray_destination(store)
        ray_exec.check_ray_source(listing.files)
        ray_exec.import_ray()
    with contextlib.ExitStack() as held:
        if executor == "ray" and ray_address is not None:  # a cluster that does not answer, or refuses this
            held.enter_context(ray_exec.ray_cluster(ray_address, num_cpus=1))  # process, is said before DST is made
        held.enter_context(destination_lock(store))  # to the last file: two packs into DST cannot interleave
        # --overwrite makes a new pack: it records what an empty DST would, nothing of the old one's
        recorded = options.to_dict() if overwrite else with_recorded_inert_options(options.to_dict(), store)
        fp = fingerprint(listing, recorded)
        plans = plan_shards(
            [s.size for s in listing.samples],
            max_count=options.max_count,
            max_size=options.max_size,
            shuffle=options.shuffle,
            seed=options.seed,
            prefix=options.prefix,
        )
        made_here = not store.remote and not os.path.exists(store.path(""))  # removed again if nothing is packed
        # --overwrite on a local DST holding a pack: the old one stays until the new one replaces it
        stage = replacement_stage(store) if overwrite else None
        work = store if stage is None else stage
        versions = input_versions(listing)
        try:
            state = prepare_destination(work, fp, plans, overwrite=overwrite and stage is None, options=recorded,
                                        versions=versions, listing=listing)
        except DestinationInUse:
            if stage is None:
                raise
            discard_replacement(stage)  # a replacement of other input or options, begun earlier
            state = prepare_destination(stage, fp, plans, overwrite=False, options=recorded, versions=versions,
                                        listing=listing)
        if state.complete is not None:
            if stage is None and store.exists(REPLACEMENT_DIR):
                left = store.child(REPLACEMENT_DIR)
                if replacement_fingerprint(left) != fp:  # another command's, abandoned (else this pack's, published)
                    log.warning("shardkit: %s: removed the unfinished replacement an earlier --overwrite with other "
                                "input or options had begun (%s/)", store.url, REPLACEMENT_DIR)
                discard_replacement(left)
            return PackResult(store.url, state.complete, time.perf_counter() - started, len(plans),
                              True)
        width = key_width(len(listing.samples))
        tasks = [
            ShardTask(work, plan, [listing.samples[i] for i in plan.members], width, listing.classes,
                      options, listing.files)
            for plan in plans
            if plan.index not in state.receipts
        ]
        tracker = as_pack_progress(progress)
        skipped = [*listing.warnings, *(s for r in state.receipts.values() for s in r.skipped)]
        if tracker is not None:
            tracker.start(len(listing.samples),
                          sum(input_bytes(listing.samples[i] for i in p.members) for p in plans))
            reused = [plans[i] for i in state.receipts]
            if reused:
                tracker.advance(sum(len(p.members) for p in reused),
                                sum(input_bytes(listing.samples[i] for i in p.members) for p in reused))
        check_budget(skipped, total, max_skipped, where=dst, finished=False)

        def check_shard(_task: ShardTask, receipt: ShardReceipt) -> None:
            skipped.extend(receipt.skipped)
            check_budget(skipped, total, max_skipped, where=dst, finished=False)

        def shard_progress(task: ShardTask, receipt: ShardReceipt) -> None:  # Ray: progress per shard
            if tracker is not None:
                tracker.advance(len(task.samples), input_bytes(task.samples))
            check_shard(task, receipt)

        ray_nodes: dict[str, int] = {}
        try:
            # memory:// lives in this process only: shards written by worker processes would vanish,
            # and they would find no source files there.
            local_only = work.process_local or listing.files.process_local
            procs = 1 if local_only else workers or usable_cores()
            if executor == "ray":
                fresh, ray_nodes = ray_exec.write_on_ray(tasks, workers=procs, address=ray_address,
                                                         on_done=shard_progress)
            else:
                fresh = run_local(tasks, procs, check_shard,
                                  None if tracker is None else tracker.advance)
        except ShardkitError:
            raise
        except BrokenExecutor as err:
            raise PackError(
                f"a writer process died (killed, e.g. out of memory: {err}); re-run the same command "
                "to resume",
                where=dst,
            ) from err
        except OSError as err:
            room = (f"; --overwrite keeps the old pack until the new one is complete, so both need room: free "
                    f"some, or remove {dst} first" if stage is not None and err.errno == errno.ENOSPC else "")
            raise PackError(f"writing shards failed ({err}){room}; re-run the same command to resume",
                            where=dst) from err
        receipts = sorted([*state.receipts.values(), *fresh], key=lambda r: r.index)
        # Rebuilt in one key order: receipts of a resumed run come back from JSON with sorted keys,
        # and index.json must be byte-identical to an uninterrupted run's.
        skipped = sorted(({"source": s["source"], "reason": s["reason"]}
                          for s in [*listing.warnings, *(s for r in receipts for s in r.skipped)]),
                         key=lambda s: (s["source"], s["reason"]))
        if total and len(skipped) >= total and stage is not None:  # nothing packed: the old pack stays
            discard_replacement(stage)
        elif total and len(skipped) >= total:  # nothing packed: no state worth resuming, and it would
            clear_destination(store)          # refuse the corrected input as "an unfinished pack of other input"
            if made_here:
                with contextlib.suppress(OSError):  # the directory this pack made, left empty
                    os.rmdir(store.path(""))
        check_budget(skipped, total, max_skipped, where=dst, finished=True)
        # once the pack has passed its checks (an error comes alone), of the images it packed
        _warn_mixed_formats(listing, options, receipts)
        _warn_emptied_classes(listing, (s["source"] for r in receipts for s in r.skipped))
        extra = dict(listing.extra)
        if listing.kind == "coco":
            # the samples the writers skipped: the scan's own refusals (a repeated image id, say) are
            # records that never became samples, and may name the file of one that was packed
            # and the images whose record gives another size than theirs: their flags are made at theirs
            sizes = {int(k): (v[0], v[1]) for r in receipts for k, v in r.image_sizes.items()}
            extra[ANNOTATION_REPORT] = annotation_report(listing, [s for r in receipts for s in r.skipped], sizes)
        # a shard whose every input was skipped holds no sample: left out of the dataset (readers such
        # as HF datasets' fail on an empty tar), its files removed; a re-run writes and removes it again
        packed = [r for r in receipts if r.num_samples]
        for r in receipts:
            if not r.num_samples:
                for name in (r.name, offsets_name(r.name), dali_index_name(r.name)):
                    work.remove(name)
        manifest = Manifest(
            kind=listing.kind,
            shards=tuple(ShardEntry(r.name, r.num_samples, r.num_bytes, r.sha256) for r in packed),
            classes=tuple(listing.classes) if listing.classes is not None else None,
            categories=tuple(listing.categories) if listing.categories is not None else None,
            skipped=tuple(skipped),
            options={**recorded, "fingerprint": fp},
            created_by=f"shardkit {_version()}",
            extra=extra,
        )
        _check_shards_in_place(work, packed)
        if stage is not None:
            publish_replacement(store, stage, manifest)
        else:
            write_manifest(store, manifest)
            finish_destination(store)
        return PackResult(store.url, manifest, time.perf_counter() - started, len(state.receipts),
                          False, ray_nodes, sum(r.num_samples for r in state.receipts.values()))


def _check_shards_in_place(store: Store, receipts: list[ShardReceipt]) -> None:
    """Before ``index.json`` is written: every shard the pack wrote or reused is there at the size
    it wrote. Another pack into the same object-store prefix (which has no lock, unlike a local
    DST) removes or rewrites shards under this one; both would otherwise publish. A shard rewritten
    at the same size goes unseen (tar pads shards to 10,240-byte blocks: small shards of two packs
    may match); ``shardkit verify`` checks contents.

    Raises:
        PackError: a shard is missing or of another size (names it); nothing is removed, and
            ``index.json`` is not written.
    """
    sizes = store.file_sizes()
    for r in receipts:
        found = sizes.get(r.name)
        if found != r.num_bytes:  # asked again of the object itself: a listing may lag behind writes
            try:
                found = store.size(r.name, fresh=True)
            except StorageError as err:
                if not isinstance(err.__cause__, FileNotFoundError):
                    raise
                found = None
        if found != r.num_bytes:
            now = "is gone" if found is None else f"is {found:,} bytes"
            raise PackError(f"{r.name} {now}, this pack wrote {r.num_bytes:,}: something else wrote to the "
                            "destination while this pack ran (another pack? object stores have no lock: one pack per "
                            "destination); index.json was not written; re-run the pack alone (it resumes, or says "
                            "what stands in its way)", where=store.url)


def _version() -> str:
    from shardkit._version import __version__

    return __version__


def _natural(warning: dict[str, Any]) -> list[Any]:
    """A skipped input's ``source`` as a sort key with its numbers compared as numbers (a table's
    ``row 2`` before its ``row 10``; a folder's zero-padded names in their order either way)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(warning["source"]))]

