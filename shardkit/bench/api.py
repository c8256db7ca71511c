"""``run_bench``: pack (if needed), then time ImageFolder, webdataset and ShardLoader side by
side."""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from shardkit.bench import baselines, conditions, runner
from shardkit.bench.checks import (
    check_same_data,
    check_shards_intact,
    check_timed_batches,
    drop_private,
    epochs_for,
    too_many_workers,
)
from shardkit.bench.config import BenchConfig, ProgressSink
from shardkit.bench.finished import FinishedRuns
from shardkit.bench.harness import Contender, RunResult, run_alternating
from shardkit.bench.report import MIN_TIMED_BATCHES, build_report, counted
from shardkit.bench.webdataset_plan import WebdatasetPlan, webdataset_plan
from shardkit.errors import PackError, ShardkitError
from shardkit.index.manifest import Manifest
from shardkit.index.manifest_io import locate_dataset, read_manifest
from shardkit.machine import usable_cores
from shardkit.storage.urls import is_remote


def _pack(cfg: BenchConfig, dst: str, n_images: int, sink: ProgressSink | None) -> dict[str, Any]:
    from shardkit.pack import PackOptions, pack, pack_captions, pack_coco
    from shardkit.pack.resume import DestinationInUse

    per_shard = _per_shard(n_images, cfg.workers)
    workers = cfg.pack_workers or usable_cores()
    if sink is not None:
        sink.begin("packing", n_images)
    options = PackOptions(max_count=per_shard, jpeg_restart=cfg.jpeg_restart)
    progress = sink.advance if sink else None
    pack_log = logging.getLogger("shardkit.pack")
    pack_log.addFilter(_not_mixed_formats)  # the bench's loaders read every member: pack's advice is not for them
    try:
        if cfg.captions:
            result = pack_captions(cfg.imagefolder, dst, options=options, workers=workers,
                                   storage_options=cfg.storage_options, progress=progress)
        elif cfg.annotations is not None:
            result = pack_coco(cfg.imagefolder, cfg.annotations, dst, drop_empty=True, options=options,
                               workers=workers, storage_options=cfg.storage_options, progress=progress)
        else:
            result = pack(cfg.imagefolder, dst, options=options, workers=workers,
                          storage_options=cfg.storage_options, progress=progress)
    except DestinationInUse as err:  # pack's remedy names its --overwrite, which bench does not have
        raise PackError(f"{err.what}; give --shards an empty or new folder (bench packs SRC there) or the folder of "
                        "a finished pack of SRC", where=err.where) from None
    finally:
        pack_log.removeFilter(_not_mixed_formats)
    return {"images": result.manifest.num_samples, "seconds": result.seconds,
            "images_per_second": result.images_per_second, "shards": len(result.manifest.shards),
            "workers": workers, "max_count": per_shard, "reused": result.already_complete}


def _per_shard(n_images: int, workers: int) -> int:
    """Images a shard of the bench's own pack: enough shards that every worker of the webdataset
    baseline gets several whole shards."""
    return max(1, min(1000, math.ceil(n_images / (4 * max(workers, 1)))))


def _planned_webdataset(cfg: BenchConfig, n_images: int) -> list[tuple[int, int]]:
    """``(batches an epoch, workers)`` of the webdataset baseline over the shards of ``--shards``
    where they are packed already, else over those the bench would pack of ``n_images`` (all
    readable), for the values the check before the pack names (the check after it counts the shards
    read); none where the baseline reads no local shards."""
    if "webdataset" not in cfg.contenders or cfg.annotations is not None or is_remote(cfg.shards or ""):
        return []
    sizes = _packed_sizes(cfg.shards)
    if sizes is None:
        per_shard = _per_shard(n_images, cfg.workers)
        sizes = [per_shard] * (n_images // per_shard) + [n_images % per_shard] * (n_images % per_shard > 0)
    plan = webdataset_plan(sizes, workers=cfg.workers, batch_size=cfg.batch_size)
    return [(plan.batches_per_epoch, plan.workers)]


def _packed_sizes(shards: str | None) -> list[int] | None:
    """The samples of each shard of the local pack at ``shards``, or None where there is none yet
    (or one the checks after refuse, with their own message)."""
    if shards is None or not os.path.isfile(os.path.join(shards, "index.json")):
        return None
    try:
        return [int(n) for n in read_manifest(locate_dataset(shards)).table.num_samples.tolist()]
    except ShardkitError:
        return None


def _not_mixed_formats(record: logging.LogRecord) -> bool:
    from shardkit.pack.api import MIXED_FORMATS

    return record.msg is not MIXED_FORMATS


def _coco_contenders(cfg: BenchConfig, shards: str, skipped: frozenset[str] = frozenset()) -> list[Contender]:
    """CocoDetection, ShardLoader's COCO CPU route and, on CUDA, its COCO GPU route. The CPU
    route's row delivers on the CPU on every device (on CUDA, ``device="cuda"`` takes the GPU
    route); the harness copies its images to the device, as it does the baseline's."""
    if cfg.annotations is None:
        raise ValueError("COCO contenders need annotations")
    annotations = cfg.annotations
    common: dict[str, Any] = {"min_size": cfg.size, "max_size": cfg.max_size, "batch_size": cfg.batch_size,
                              "workers": cfg.workers}
    out = [Contender("cocodetection", "torchvision CocoDetection + DataLoader",
                     lambda: baselines.cocodetection_loader(cfg.imagefolder, annotations, device=cfg.device,
                                                            skip=skipped, **common), baseline=True)]
    if "shardloader" in cfg.contenders:
        out.append(Contender("shardloader", "shardkit ShardLoader (COCO route)",
                             lambda: runner.detection_shardloader(shards, storage_options=cfg.storage_options,
                                                                  device="cpu", **common),
                             stages=runner.shardloader_stages))
        if cfg.device.startswith("cuda"):
            out.append(Contender("shardloader-gpu", "shardkit ShardLoader (COCO GPU route)",
                                 lambda: runner.detection_shardloader(shards, storage_options=cfg.storage_options,
                                                                      device=cfg.device, **common),
                                 stages=runner.shardloader_stages))
    return out


def _contenders(cfg: BenchConfig, shards: str, shard_paths: list[str] | None, skipped: frozenset[str],
                plan: WebdatasetPlan) -> list[Contender]:
    """The loaders to time. ``skipped``: source files (relative to the tree) the pack left out as
    unreadable, which the torchvision baselines leave out too; ``plan``: the plain webdataset
    baseline's workers and batching (see :func:`webdataset_plan`)."""
    if cfg.annotations is not None:
        return _coco_contenders(cfg, shards, skipped)
    if cfg.captions:
        return _caption_contenders(cfg, shards, shard_paths, plan)
    common: dict[str, Any] = {"size": cfg.size, "train": cfg.transform == "train",
                              "batch_size": cfg.batch_size,
              "workers": cfg.workers, "device": cfg.device}
    # On CUDA the loader picks its GPU path (nvJPEG) when it can; stages say which path ran.
    where = "CPU decode" if cfg.device == "cpu" else f"{cfg.device} path"
    out = [Contender("imagefolder", "torchvision ImageFolder + DataLoader",
                     lambda: baselines.imagefolder_loader(cfg.imagefolder, skip=skipped, **common),
                     baseline=True)]
    if "webdataset" in cfg.contenders and shard_paths is not None:
        wds_common = {**common, "workers": plan.workers, "rebatch": plan.rebatch}
        out.append(Contender("webdataset", f"webdataset + WebLoader (PIL{_how(cfg, plan)})",
                             lambda: baselines.webdataset_loader(shard_paths, **wds_common)))
    if "shardloader" in cfg.contenders:
        out.append(Contender("shardloader", f"shardkit ShardLoader ({where})",
                             lambda: runner.shardloader(shards, storage_options=cfg.storage_options,
                                                        **common),
                             stages=runner.shardloader_stages))
    return out


def _caption_contenders(cfg: BenchConfig, shards: str, shard_paths: list[str] | None,
                        plan: WebdatasetPlan) -> list[Contender]:
    """Plain webdataset (the baseline) and ShardLoader over the same captioned shards, the same crop
    and tokenizer."""
    if shard_paths is None:
        raise ValueError("the captioned bench reads local shards (its webdataset baseline opens the tar files)")
    common: dict[str, Any] = {"size": cfg.size, "train": cfg.transform == "train", "batch_size": cfg.batch_size,
                              "workers": cfg.workers, "device": cfg.device, "context_length": cfg.context_length}
    wds_common = {**common, "workers": plan.workers, "rebatch": plan.rebatch}
    out = [Contender("webdataset", f"webdataset + WebLoader (PIL, to_tuple jpg txt{_how(cfg, plan)})",
                     lambda: baselines.webdataset_caption_loader(shard_paths, **wds_common), baseline=True)]
    if "shardloader" in cfg.contenders:
        where = "CPU decode" if cfg.device == "cpu" else f"{cfg.device} path"
        out.append(Contender("shardloader", f"shardkit ShardLoader ({where}, text_transform)",
                             lambda: runner.caption_shardloader(shards, storage_options=cfg.storage_options, **common),
                             stages=runner.shardloader_stages))
    return out


def _how(cfg: BenchConfig, plan: WebdatasetPlan) -> str:
    """What a webdataset row's label adds: fewer workers than asked for, rebatched."""
    fewer = "" if plan.workers == cfg.workers else f", {counted(plan.workers, 'worker')}"
    return fewer + (", rebatched" if plan.rebatch else "")


def _drop(_contender: Contender) -> None:
    conditions.drop_page_cache()


def run_bench(cfg: BenchConfig, *, sink: ProgressSink | None = None,
              after_run: Callable[[str, int, RunResult], None] | None = None,
              note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the whole comparison and return the report dict (:mod:`shardkit.bench.report`).

    ``note(text)`` hears, before the timed runs, what the bench changed so that every loader can
    run: source files left out as unreadable (the pack skipped them, so the torchvision baselines
    skip them too rather than fail on them), and the webdataset baseline's workers lowered to the
    shard count. The same notes are in the report (``conditions["notes"]``).

    Raises:
        ValueError: invalid settings or too few images for one batch after warm-up.
        ShardkitError: packing or reading the shards failed.
        Interrupted: the bench was stopped part-way (Ctrl-C, SIGTERM); it carries the report of
            the runs it finished (marked ``interrupted``), or None where none finished.

    Example::

        report = run_bench(BenchConfig("data/train", workers=2, batch_size=64, repeats=5))
        print(format_table(report))
    """
    cfg.validate()
    if cfg.captions:
        data = conditions.describe_captions(cfg.imagefolder, quiet=cfg.shards is None)  # the pack says them
    elif cfg.annotations is not None:
        data = conditions.describe_coco(cfg.imagefolder, cfg.annotations)
    else:
        data = conditions.describe_imagefolder(cfg.imagefolder)
    source_files = data.pop("paths") if cfg.captions else None
    chosen = cfg.epochs is None
    if chosen:
        cfg = replace(cfg, epochs=epochs_for(data["images"], batch_size=cfg.batch_size, warmup=cfg.warmup,
                                             workers=cfg.workers))
    assert cfg.epochs is not None
    check_timed_batches(data["images"], batch_size=cfg.batch_size, epochs=cfg.epochs, warmup=cfg.warmup,
                        workers=cfg.workers, others=_planned_webdataset(cfg, data["images"]))
    tmp = tempfile.mkdtemp(prefix="shardkit-bench-") if cfg.shards is None else None
    shards = cfg.shards or os.path.join(tmp or "", "shards")
    try:
        store = locate_dataset(shards, cfg.storage_options)
        pack_info = None if store.exists("index.json") else _pack(cfg, shards, data["images"], sink)
        manifest = read_manifest(store)
        check_same_data(manifest, data, shards, cfg.jpeg_restart)
        check_shards_intact(store, manifest, shards)
        drop_private(data)
        remote = is_remote(shards)
        shard_paths = None if remote else [store.path(s.url) for s in manifest.shards]
        skipped = frozenset(s["source"] for s in manifest.skipped)
        plan = webdataset_plan(manifest.table.num_samples.tolist(), workers=cfg.workers, batch_size=cfg.batch_size)
        per_epoch = manifest.num_samples // cfg.batch_size
        wds_per_epoch = (plan.batches_per_epoch if shard_paths is not None and "webdataset" in cfg.contenders
                         and cfg.annotations is None else per_epoch)
        if chosen:  # again for the readable images, which may be fewer than the source files
            cfg = replace(cfg, epochs=epochs_for(manifest.num_samples, batch_size=cfg.batch_size, warmup=cfg.warmup,
                                                 workers=cfg.workers, per_epoch=min(per_epoch, wds_per_epoch)))
        assert cfg.epochs is not None
        notes = _notes(cfg, manifest, shard_paths is not None, plan)
        if chosen and cfg.epochs > 2:
            batches = counted(per_epoch, "batch", "batches")
            fewer = ("" if wds_per_epoch >= per_epoch else
                     f" (webdataset's workers, each batching its own shards: {wds_per_epoch})")
            least = (f"at least three times what {counted(cfg.workers, 'worker')} "
                     f"{'prepares' if cfg.workers == 1 else 'prepare'} ahead" if cfg.workers else
                     f"at least {MIN_TIMED_BATCHES} batches, the fewest a ratio to the baseline rests on")
            notes.insert(0, f"{cfg.epochs} epochs a run: {counted(manifest.num_samples, 'image')} make {batches} of "
                            f"{cfg.batch_size} an epoch{fewer}, and a run times {least} (--epochs to choose)")
        for text in notes:
            if note is not None:
                note(text)
        wds_fewer = [(wds_per_epoch, plan.workers)] if wds_per_epoch < per_epoch else []
        check_timed_batches(manifest.num_samples, batch_size=cfg.batch_size, epochs=cfg.epochs, warmup=cfg.warmup,
                            workers=cfg.workers, kind="readable ", others=wds_fewer)
        if wds_fewer:  # each worker batches its own shards and drops its last partial batch
            check_timed_batches(manifest.num_samples, batch_size=cfg.batch_size, epochs=cfg.epochs, warmup=cfg.warmup,
                                workers=plan.workers, kind="readable ", per_epoch=wds_per_epoch,
                                whose=f"webdataset's {counted(plan.workers, 'worker')}, each batching its own "
                                      f"shards ({plan.described()}), make", others=[(per_epoch, cfg.workers)])
        warmup = cfg.warmup
        cache = "warm (every file read once before the runs)"
        drop: Callable[[Contender], None] | None = None
        if cfg.drop_caches:
            why = conditions.drop_page_cache()
            if why is None:
                cache, drop = "cold (dropped before every run)", _drop
            else:
                cache = f"warm: could not drop the page cache ({why})"
        if drop is None:
            conditions.warm_page_cache((source_files if source_files is not None
                                        else conditions.files_under(cfg.imagefolder)) + (shard_paths or []))
        conds = {"machine": conditions.machine(), "versions": conditions.versions(),
                 "gpu": conditions.gpu(cfg.device), "data": data, "page_cache": cache,
                 "shards_location": "remote" if remote else "local",
                 "shards": {"url": shards, "count": len(manifest.shards),
                            "bytes": manifest.num_bytes, "temporary": tmp is not None,
                            "jpeg_restart": manifest.options.get("jpeg_restart")},
                 "notes": notes}
        contenders = _contenders(cfg, shards, shard_paths, skipped, plan)
        epoch_batches = {c.name: wds_per_epoch if c.name == "webdataset" else per_epoch for c in contenders}
        config = {**asdict(cfg), "warmup": warmup, "storage_options": None,
                  "contenders": [c.name for c in contenders]}
        finished: FinishedRuns[RunResult] = FinishedRuns([c.name for c in contenders], cfg.repeats, after_run)

        def report(runs: dict[str, list[RunResult]], mark: dict[str, Any]) -> dict[str, Any]:
            done = [c for c in contenders if c.name in runs]
            return {**build_report(config, conds, pack_info, done, runs), "interrupted": mark}

        with finished.kept(report):  # Ctrl-C, SIGTERM: Interrupted, with the report of the runs finished
            runs = _run(cfg, contenders, warmup, epoch_batches, drop, sink, finished.add)
        return build_report(config, conds, pack_info, contenders, runs)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _notes(cfg: BenchConfig, manifest: Manifest, webdataset: bool, plan: WebdatasetPlan) -> list[str]:
    """What :func:`run_bench` tells before timing (see its ``note``)."""
    notes = []
    if manifest.skipped:
        first = sorted(manifest.skipped, key=lambda s: s["source"])[0]
        more = len(manifest.skipped) - 1
        what = "source input" if cfg.captions else "unreadable source file"  # a caption's skip: its text, say
        notes.append(f"{counted(len(manifest.skipped), what)} left out by every loader, as "
                     f"pack skipped {'them' if more else 'it'}: {first['source']}: {first['reason']}"
                     + (f" (and {more} more, listed in index.json)" if more else ""))
    if (crowded := too_many_workers(cfg.workers)) is not None:
        notes.append(crowded)
    shards = len(manifest.shards)
    if not webdataset and "webdataset" in cfg.contenders and cfg.annotations is None and not cfg.captions:
        notes.append("no webdataset row: its baseline opens local tar files, and --shards is a URL (pack to a "
                     "local folder for it)")
    if webdataset and "webdataset" in cfg.contenders and cfg.annotations is None and shards < cfg.workers:
        others = "ShardLoader keeps" if cfg.captions else "ShardLoader and ImageFolder keep"
        notes.append(f"webdataset splits whole shards between its workers, and {counted(shards, 'shard')} "
                     f"cannot feed {cfg.workers} workers: its baseline runs with {counted(shards, 'worker')} "
                     f"({others} all; pack with a lower --max-count for more shards)")
    if webdataset and "webdataset" in cfg.contenders and cfg.annotations is None and plan.rebatch:
        notes.append(f"webdataset's {counted(plan.workers, 'worker')} read {plan.described()} from their shards, "
                     f"{'less than a batch' if max(plan.shares) < cfg.batch_size else 'for some less than a batch'} "
                     f"of {cfg.batch_size}: "
                     "its baseline keeps each worker's partial batches and rebatches them in the WebLoader "
                     f"(.unbatched().batched({cfg.batch_size}), as webdataset's documentation advises)")
    return notes


def _run(cfg: BenchConfig, contenders: list[Contender], warmup: int, per_epoch: dict[str, int],
         drop: Callable[[Contender], None] | None, sink: ProgressSink | None,
         after_run: Callable[[str, int, RunResult], None] | None) -> dict[str, list[RunResult]]:
    runs: Counter[str] = Counter()

    def before(c: Contender) -> None:
        runs[c.name] += 1
        if sink is not None:  # counted per loader, as the lines printed without a bar count them
            sink.describe(f"{c.name} run {runs[c.name]}/{cfg.repeats}")
        if drop is not None:
            drop(c)

    def progress(_name: str, n: int) -> None:
        if sink is not None:
            sink.advance(n)

    assert cfg.epochs is not None  # chosen by run_bench where not given
    if sink is not None:
        sink.begin("timing", cfg.repeats * cfg.epochs * sum(per_epoch.values()))
    return run_alternating(contenders, repeats=cfg.repeats, epochs=cfg.epochs, warmup=warmup,
                           device=cfg.device, progress=progress, before_run=before,
                           after_run=after_run)
