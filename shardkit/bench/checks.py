"""Whether a bench can compare what it is asked to: the same data on every side (shards that are
a pack of the source the baselines read) and a timed part that measures the loaders. Every check
runs before any timing and raises ``ValueError`` with the counts and what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardkit.bench.report import MIN_TIMED_BATCHES, counted
from shardkit.errors import LoaderError
from shardkit.index.manifest import Manifest
from shardkit.index.manifest_io import locate_dataset, read_manifest
from shardkit.loader.read.claims import file_faults
from shardkit.loader.routes.coco.target import contiguous_label_map
from shardkit.machine import auto_workers, cores_of_this_process
from shardkit.storage import Store

__all__ = ["AHEAD_PER_WORKER", "check_same_data", "check_shards_intact", "check_timed_batches",
           "check_train_shards", "drop_private", "epochs_for", "too_many_workers"]


def check_same_data(manifest: Manifest, data: dict[str, Any], shards: str, jpeg_restart: int | None, *,
                    can_omit: bool = True) -> None:
    """Refuse shards that cannot be a pack of the source being compared (``data``: what
    :func:`conditions.describe_imagefolder <shardkit.bench.conditions.describe_imagefolder>` or
    ``describe_coco`` says of it), or, when ``jpeg_restart`` is asked for, were packed without it.
    ``can_omit``: the message offers omitting ``--shards`` (the bench then packs) as a way out.

    Raises:
        ValueError: another kind of data, another number of images (or classes, or COCO category
            ids), or packed without ``jpeg_restart``; the message says which and what to do.
    """
    packed = manifest.num_samples + len(manifest.skipped)
    omit = ", or omit --shards" if can_omit else ""
    if data.get("kind") == "captions":
        if manifest.kind != "captions" or packed != data["images"]:
            raise ValueError(f"--shards {shards} holds {_held(manifest, packed)}, but "
                             f"{data['path']} has {data['images']} captioned images: the comparison would not be on "
                             f"the same data (pack it with shardkit pack --format captions{omit})")
        # no fingerprint check: a pack's column choices (extra_columns, ...) are in its fingerprint but not
        # recorded, so the source cannot be listed again as it was packed
    elif data.get("kind") == "coco":  # packed with drop_empty: the images that have annotations
        ids = list(contiguous_label_map(manifest.categories)) if manifest.kind == "coco" else None
        if manifest.kind != "coco" or packed != data["images"] or ids != data["category_ids"]:
            raise ValueError(
                f"--shards {shards} holds {_held(manifest, packed)}, but {data['path']} has COCO annotations "
                f"for {data['images']} images and {len(data['category_ids'])} categories: the comparison would not "
                f"be on the same data (pack its annotated images: shardkit pack --annotations --drop-empty{omit})")
    elif (manifest.kind != "imagefolder" or len(manifest.classes or ()) != data["classes"]
          or packed != data["images"]):
        raise ValueError(
            f"--shards {shards} holds {_held(manifest, packed)}, but {data['path']} has {data['classes']} classes "
            f"and {data['images']} images: the comparison would not be on the same data (pack it "
            f"with shardkit pack{omit})"
        )
    elif "class_names" in data and not _unnamed(manifest) and list(manifest.classes or ()) != list(data["class_names"]):
        ours, theirs = list(manifest.classes or ()), list(data["class_names"])
        i = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        raise ValueError(
            f"--shards {shards} names its classes otherwise than {data['path']} (class {i}: {ours[i]!r} "
            f"packed, {theirs[i]!r} in the folder): the comparison would not be on the same data (pack it "
            f"with shardkit pack{omit})"
        )
    elif _other_files(manifest, data):
        raise ValueError(
            f"--shards {shards} was packed from other files than {data['path']} holds (the same classes and "
            f"number of images, other names or sizes: another tree, or this one changed since): the comparison "
            f"would not be on the same data (pack it again with shardkit pack{omit})"
        )
    resized = manifest.options.get("resize_max")
    if resized is not None:
        raise ValueError(
            f"--shards {shards} was packed with resize_max={resized} (its images re-encoded at that shorter side), "
            f"but the other loaders read {data['path']}'s originals: the comparison would not be on the same images "
            f"(pack it without --resize-max{omit})"
        )
    packed_with = manifest.options.get("jpeg_restart")
    if jpeg_restart is not None and packed_with != jpeg_restart:
        raise ValueError(
            f"--shards {shards} was packed with jpeg_restart={packed_with}, not {jpeg_restart}: "
            f"repack it with shardkit pack --jpeg-restart {jpeg_restart} --overwrite, or omit "
            "--jpeg-restart to use it as it is"
        )


def _held(manifest: Manifest, packed: int) -> str:
    """What ``manifest``'s shards hold, by what its kind counts: ``imagefolder data of 2 classes and
    24 source images``, ``coco data of 24 source images and 15 categories``, ``captions data of 24
    source images``."""
    images = counted(packed, "source image")
    if manifest.kind == "imagefolder":
        return f"imagefolder data of {counted(len(manifest.classes or ()), 'class', 'classes')} and {images}"
    if manifest.kind == "coco":
        return f"coco data of {images} and {counted(len(manifest.categories or ()), 'category', 'categories')}"
    return f"{manifest.kind} data of {images}"


def _unnamed(manifest: Manifest) -> bool:
    """Whether ``manifest``'s classes are only their labels (``"0"``, ``"1"``, ...): shards adopted
    with ``shardkit index`` without ``--classes`` know no names to compare."""
    return manifest.adopted and list(manifest.classes or ()) == [str(i) for i in range(len(manifest.classes or ()))]


def _other_files(manifest: Manifest, data: dict[str, Any]) -> bool:
    """Whether ``data``'s listing (an ImageFolder tree's) is not what ``manifest`` was packed from:
    ``shardkit pack`` records a fingerprint of its source's file names, sizes, labels and its
    options; adopted shards have none, and another version's is not compared (False)."""
    from shardkit import __version__
    from shardkit.pack.resume import fingerprint

    listing, recorded = data.get("listing"), manifest.options.get("fingerprint")
    if listing is None or not recorded or manifest.created_by != f"shardkit {__version__}":
        return False  # another version may compute it otherwise
    options = {key: value for key, value in manifest.options.items() if key != "fingerprint"}
    return bool(fingerprint(listing, options) != recorded)


def drop_private(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a ``describe_*`` result) without what only the checks use, for a report."""
    for key in ("class_names", "listing"):
        data.pop(key, None)
    return data


#: Batches each worker of a loader prepares ahead (DataLoader's ``prefetch_factor``, ShardLoader's ``prefetch``).
AHEAD_PER_WORKER = 2


def epochs_for(images: int, *, batch_size: int, warmup: int, workers: int, per_epoch: int | None = None) -> int:
    """The epochs a run takes when none is asked for: 2, or more where the data set is small, the
    fewest whose timed batches (those after ``warmup``) number at least three times what
    ``workers`` prepare ahead, so that a run times the loaders, not a queue filled before it, and
    at least the :data:`~shardkit.bench.report.MIN_TIMED_BATCHES` a ratio to the baseline needs.
    ``per_epoch``: the batches of an epoch where a loader makes fewer than ``images // batch_size``
    (webdataset's workers, each batching its own shards).

    >>> epochs_for(300, batch_size=64, warmup=5, workers=0)  # 4 batches an epoch: 3 epochs time 7
    3
    """
    per_epoch = images // batch_size if per_epoch is None else per_epoch
    if per_epoch < 1:
        return 2  # no batch at all: check_timed_batches says so
    needed = warmup + max(3 * max(workers * AHEAD_PER_WORKER, 1), MIN_TIMED_BATCHES)
    return max(2, -(-needed // per_epoch))


def check_timed_batches(images: int, *, batch_size: int, epochs: int, warmup: int, workers: int,
                        kind: str = "", per_epoch: int | None = None, whose: str = "",
                        others: Sequence[tuple[int, int]] = ()) -> None:
    """Refuse a plan whose timed batches would not measure the loaders: none left after the
    warm-up, or no more than the workers prepare ahead (a timed part that only empties a full
    queue gives any rate at all, and CPU figures over seconds of work done before it).
    ``per_epoch``: the batches of an epoch of one loader that makes fewer than
    ``images // batch_size``, which ``whose`` (the start of the message) names.
    ``others``: ``(batches an epoch, workers)`` of the bench's other loaders where they differ: the
    ``--epochs`` and ``--warmup`` the error names pass every loader's check, so that one retry runs.

    Raises:
        ValueError: saying which counts, and the values of ``--epochs`` and of ``--warmup`` that pass.
    """
    if per_epoch is None:
        per_epoch = images // batch_size
    if per_epoch < 1:
        raise ValueError(f"{images} {kind}images make no full batch of {batch_size}: lower --batch-size")
    total = per_epoch * epochs
    timed = total - warmup
    ahead = workers * AHEAD_PER_WORKER
    if timed <= ahead:
        batches = counted(timed, "batch", "batches")
        left = (f"leave none to time after --warmup {warmup}" if timed < 1 else
                f"leave {batches} to time after --warmup {warmup}, no more than the {ahead} that "
                f"{counted(workers, 'worker')} prepare ahead: the rates would time a full queue, not the loaders")
        which = ", which" if whose else ""
        fixes = _what_works([(per_epoch, workers), *(o for o in others if o[0] >= 1)], epochs=epochs, warmup=warmup)
        raise ValueError(f"{whose}{' ' if whose else ''}{counted(total, 'batch', 'batches')} of {batch_size} in "
                         f"{counted(epochs, 'epoch')} of {images} {kind}images{which} {left}; {fixes}")


def _what_works(loaders: Sequence[tuple[int, int]], *, epochs: int, warmup: int) -> str:
    """What to change, with the value that passes :func:`check_timed_batches` for each of
    ``loaders`` (``(batches an epoch, workers)``), the others as given: the fewest ``--epochs``
    and, where any leaves enough to time, the most ``--warmup``.

    >>> _what_works([(4, 2)], epochs=1, warmup=5)
    'raise --epochs to 3'
    >>> _what_works([(4, 2), (3, 2)], epochs=4, warmup=8)
    'raise --epochs to 5, or lower --warmup to 7'
    """
    fewest_epochs = max((warmup + workers * AHEAD_PER_WORKER) // per_epoch + 1 for per_epoch, workers in loaders)
    most_warmup = min(per_epoch * epochs - workers * AHEAD_PER_WORKER - 1 for per_epoch, workers in loaders)
    fix = f"raise --epochs to {fewest_epochs}"
    return fix if most_warmup < 0 else f"{fix}, or lower --warmup to {most_warmup}"


def check_shards_intact(store: Store, manifest: Manifest, shards: str) -> None:
    """Every shard ``index.json`` names is there on a local disk, a file of the size it records: a
    loader or baseline would otherwise stop on it partway through the runs (a baseline with its own
    traceback). ``shardkit verify`` checks the contents. A remote dataset is left to the loader,
    which checks each shard's size and sha256 as it fetches it.

    Raises:
        ValueError: naming the first damaged shards, and the command that tells more.
    """
    if store.remote:
        return
    said = {"missing": "is missing", "unreadable": "cannot be read ({})", "not regular": "is not a file",
            "size": "has {:,} bytes, index.json says {:,}"}
    table = manifest.table
    damaged = [f"{table.urls[f.shard]} " + said[f.what].format(f.detail, int(table.num_bytes[f.shard]))
               for f in file_faults(store, table)]
    if damaged:
        more = f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else ""
        raise ValueError(f"--shards {shards} is damaged: {'; '.join(damaged[:3])}{more}; shardkit verify {shards} "
                         "tells more")


def check_train_shards(shards: str, data: dict[str, Any], batch_size: int) -> None:
    """The training bench's checks: ``shards`` an intact pack of the ImageFolder tree ``data``
    describes (the loaders compared on the same images), with a full batch per epoch for every
    loader.
    Leaves what only the checks use out of ``data`` (the report's).

    Raises:
        ValueError: another dataset, a damaged one, or too few images for one batch.
    """
    store = locate_dataset(shards)
    manifest = read_manifest(store)
    check_same_data(manifest, data, shards, None, can_omit=False)
    check_shards_intact(store, manifest, shards)
    drop_private(data)
    fewest = min(manifest.num_samples, data["images"])
    if fewest < batch_size:
        raise ValueError(f"{fewest} images make no full batch of {batch_size}: lower --batch-size")


def too_many_workers(workers: int) -> str | None:
    """The bench's one note that ``workers`` are more than this process's share of the cores
    (None: they are not, or the share cannot be told), said in place of the loaders' warnings
    that :func:`~shardkit.bench.harness.quiet_worker_count` leaves out."""
    try:
        cores, auto = cores_of_this_process(), auto_workers()
    except LoaderError:  # a launcher's malformed LOCAL_WORLD_SIZE: the loaders say so where it matters
        return None
    if workers <= cores:
        return None
    return (f"{counted(workers, 'worker')} a loader, more than the {counted(cores, 'core')} that "
            f"{'is' if cores == 1 else 'are'} this process's share: the workers take turns on them "
            f"(--workers auto picks {auto})")
