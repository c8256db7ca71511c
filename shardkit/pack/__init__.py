"""Packing: plan shards (pure), write them (processes or Ray), publish ``index.json`` last."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardkit.pack.api import Executor, PackResult, pack_listing
from shardkit.pack.options import PackOptions, parse_size
from shardkit.pack.pool import exit_if_reentered
from shardkit.pack.progress import PackProgress, Progress
from shardkit.pack.skips import SkipBudget, SkipBudgetError
from shardkit.sources import scan_caption_folder, scan_caption_table, scan_coco, scan_imagefolder
from shardkit.sources.hf import is_hf_dataset, scan_hf_dataset, scan_hf_labelled
from shardkit.sources.table import is_table

__all__ = ["Executor", "PackOptions", "PackProgress", "PackResult", "Progress", "SkipBudget",
           "SkipBudgetError", "pack", "pack_captions", "pack_coco", "pack_listing", "parse_size"]


def pack(
    src: str,
    dst: str,
    *,
    options: PackOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    progress: Progress | PackProgress | None = None,
    executor: Executor = "processes",
    ray_address: str | None = None,
    max_skipped: SkipBudget | None = None,
    allow_empty: bool = False,
    split: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> PackResult:
    """Pack the ImageFolder tree ``src`` into WebDataset-compatible shards under ``dst``.

    Args:
        src: root of an ImageFolder tree (``src/<class>/<images>``), read like torchvision: a
            directory or an fsspec URL (``s3://bucket/train``), or a local HF ``datasets``
            dataset saved with ``save_to_disk`` whose ``ClassLabel`` column labels its images
            (:func:`~shardkit.sources.hf.scan_hf_labelled`); the same tree gives the same
            shards and ``index.json`` from either.
        dst: output directory or fsspec URL (``s3://bucket/prefix``, ``memory://x``).
        options: shard sizes, shuffling, re-encoding (:class:`PackOptions`).
        workers: writer processes (default: the cores this process may use, its CPU affinity).
            Output does not depend on it.
        overwrite: replace whatever shardkit files DST holds.
        storage_options: passed to fsspec for ``dst`` (credentials, endpoint).
        source_options: passed to fsspec for a URL ``src`` (default: ``storage_options``).
        progress: called with the number of samples finished, as shards complete; or a
            :class:`PackProgress`, which also gets the totals and input bytes (for an ETA).
        executor: ``"processes"`` (a local process pool) or ``"ray"`` (one Ray task per shard;
            same bytes). A local ``dst`` needs a single-node cluster; remote URLs work anywhere.
        ray_address: with ``executor="ray"``: ``"auto"``, ``"ray://host:port"``, or ``None`` to use
            an already initialised Ray or start a local cluster of ``workers`` CPUs (stopped after).
        max_skipped: fail (before publishing) when more inputs are skipped than this
            :class:`SkipBudget` allows (a count or a percentage). A pack that would publish no
            sample fails in any case.
        allow_empty: keep class folders without an image file in the class list, as
            ``ImageFolder(allow_empty=True)`` does (refused otherwise, as torchvision refuses them).
        split: the split of a saved HF ``DatasetDict`` to pack.
        image_column: a saved HF dataset's ``Image`` column (default: the only one).
        label_column: a saved HF dataset's ``ClassLabel`` column (default: the only one).

    Returns:
        A :class:`PackResult` with the manifest written.

    Raises:
        SourceError: ``src`` is not an ImageFolder tree (missing, no class folders, …).
        SkipBudgetError: more inputs skipped than ``max_skipped`` allows, or none packed; no
            ``index.json`` is written, complete shards are kept for a re-run to resume.
        PackError: DST holds a different dataset or unfinished pack (without ``overwrite``); a shard
            failed (named); Ray is missing, ``dst`` is ``memory://`` with ``executor="ray"``, or
            ``src`` or ``dst`` is a local path on a Ray cluster of several nodes.
        StorageError: DST cannot be written, or a URL ``src`` cannot be listed or read (missing
            bucket, network, credentials; the pack stops and resumes when re-run).

    Example::

        result = pack("data/train", "shards/train", options=PackOptions(max_count=1000))
        print(result.manifest.num_samples, len(result.manifest.shards))
    """
    exit_if_reentered()  # a spawned writer importing a script that calls this at its top level
    if "://" not in src and is_hf_dataset(src):
        if allow_empty:
            raise ValueError("allow_empty applies to an ImageFolder tree; a HF dataset's classes are its "
                             "ClassLabel's names, each kept")
        listing = scan_hf_labelled(src, split=split, image_column=image_column, label_column=label_column)
    elif split is not None or image_column is not None or label_column is not None:
        raise ValueError(f"split, image_column and label_column apply to a saved HF dataset, not to {src}")
    else:
        listing = scan_imagefolder(src, storage_options=_source_options(source_options, storage_options),
                                   allow_empty=allow_empty)
    return pack_listing(
        listing, dst, options=options, workers=workers, overwrite=overwrite,
        storage_options=storage_options, progress=progress, executor=executor,
        ray_address=ray_address, max_skipped=max_skipped,
    )


def pack_coco(
    images_dir: str,
    annotations: str,
    dst: str,
    *,
    drop_empty: bool = False,
    options: PackOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    progress: Progress | PackProgress | None = None,
    executor: Executor = "processes",
    ray_address: str | None = None,
    max_skipped: SkipBudget | None = None,
) -> PackResult:
    """Pack a COCO detection dataset: one sample per image record of ``annotations``.

    Each sample holds the original image bytes and a ``json`` member
    ``{"image": <record>, "annotations": [<its records>], "source": <file_name>}``, the records
    exactly as in the file; ``index.json`` gets ``kind: "coco"``, ``categories`` and
    ``info``/``licenses``. Image records that cannot be packed are listed in ``skipped``;
    annotations dropped for bad references, and flagged boxes, are counted apart in
    ``annotation_report`` (:func:`shardkit.pack.annotations.annotation_report`; see
    :func:`shardkit.sources.scan_coco`). Other arguments as for :func:`pack`.

    Args:
        images_dir: folder the image records' ``file_name``s are relative to (a path or fsspec
            URL).
        annotations: the COCO instances JSON file (a path or fsspec URL).
        drop_empty: leave out images without annotations (kept by default).
        source_options: fsspec options for URLs ``images_dir`` and ``annotations`` (default:
            ``storage_options``).

    Raises:
        SourceError: the folder or file is missing, or the JSON is malformed.
        ValueError: ``options.resize_max`` is set (re-encoding would invalidate the boxes).
        PackError, StorageError: as for :func:`pack`.

    Example::

        pack_coco("coco/val2017", "coco/annotations/instances_val2017.json", "shards/val")
    """
    exit_if_reentered()  # a spawned writer importing a script that calls this at its top level
    if options is not None and options.resize_max is not None:
        raise ValueError("resize_max is not supported for COCO: resizing would invalidate the "
                         "annotations")
    listing = scan_coco(images_dir, annotations, drop_empty=drop_empty,
                        storage_options=_source_options(source_options, storage_options))
    return pack_listing(
        listing, dst, options=options, workers=workers, overwrite=overwrite,
        storage_options=storage_options, progress=progress, executor=executor,
        ray_address=ray_address, max_skipped=max_skipped,
    )


def pack_captions(
    src: str,
    dst: str,
    *,
    image_column: str | None = None,
    caption_column: str | None = None,
    extra_columns: Sequence[str] | None = None,
    images_root: str | None = None,
    split: str | None = None,
    options: PackOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    progress: Progress | PackProgress | None = None,
    executor: Executor = "processes",
    ray_address: str | None = None,
    max_skipped: SkipBudget | None = None,
) -> PackResult:
    """Pack captioned images (image-text pairs): one sample per image, its members the image
    (``jpg``, ``png``, ...), ``txt`` (the caption, UTF-8) and ``json`` (extra fields plus
    ``source``, ``width``, ``height``), as img2dataset writes them; ``index.json`` gets
    ``kind: "captions"``, ``kind_version: 1``. Other arguments as for :func:`pack`.

    Args:
        src: a folder of images with ``.txt`` (and optional ``.json``) sidecars
            (:func:`shardkit.sources.scan_caption_folder`), or a ``.csv``/``.tsv``/``.jsonl``/
            ``.parquet`` table of image paths or URLs and captions
            (:func:`shardkit.sources.scan_caption_table`); a path or fsspec URL. Or a HF
            ``datasets`` image–text dataset saved with ``save_to_disk``, a local directory
            (:func:`shardkit.sources.hf.scan_hf_dataset`).
        image_column, caption_column, extra_columns, images_root: a table's (or HF dataset's)
            columns and where a table's relative paths start (see
            :func:`~shardkit.sources.scan_caption_table`); refused for a folder.
        split: the split of a saved HF ``DatasetDict``.

    Raises:
        SourceError: a folder without images, a table that cannot be read, a column missing or
            holding what it cannot (naming the table, the row or the column). Rows and images
            without a caption are skipped with a reason, like unreadable images.
        ValueError: table options given for a folder.
        PackError, StorageError, SkipBudgetError: as for :func:`pack`.

    Example::

        pack_captions("pairs.parquet", "shards/pairs", image_column="url", caption_column="text")
    """
    exit_if_reentered()  # a spawned writer importing a script that calls this at its top level
    opts = _source_options(source_options, storage_options)
    hf = not is_table(src) and is_hf_dataset(src)
    if split is not None and not hf:
        raise ValueError(f"split applies to a saved HF DatasetDict, not to {src}")
    if hf and images_root is not None:
        raise ValueError(f"images_root applies to a caption table, not to the HF dataset {src}")
    if is_table(src):
        listing = scan_caption_table(src, image_column=image_column, caption_column=caption_column,
                                     extra_columns=extra_columns, images_root=images_root, storage_options=opts)
    elif hf:
        listing = scan_hf_dataset(src, split=split, image_column=image_column, caption_column=caption_column,
                                  extra_columns=extra_columns)
    else:
        given = [name for name, value in (("image_column", image_column), ("caption_column", caption_column),
                                          ("extra_columns", extra_columns), ("images_root", images_root))
                 if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to a caption table (.csv, .tsv, .jsonl, .parquet) or a saved "
                             f"HF dataset, not to the folder {src}")
        listing = scan_caption_folder(src, storage_options=opts)
    return pack_listing(
        listing, dst, options=options, workers=workers, overwrite=overwrite,
        storage_options=storage_options, progress=progress, executor=executor,
        ray_address=ray_address, max_skipped=max_skipped,
    )


def _source_options(source: dict[str, Any] | None,
                    storage: dict[str, Any] | None) -> dict[str, Any] | None:
    return source if source is not None else storage
