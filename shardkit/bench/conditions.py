"""The conditions a benchmark ran under: machine, library versions, data, page cache.

Numbers without conditions mislead; every report carries what this module collects.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shardkit.machine import usable_cores

_PACKAGES = ("torch", "torchvision", "webdataset", "pillow", "pillow-simd", "numpy", "torchcodec")


def machine() -> dict[str, Any]:
    """Cores (total and usable by this process), CPU model, memory, OS, Python, load average."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(), "usable_cores": usable_cores(), "cpu_model": _cpu_model(),
        "platform": platform.platform(), "python": platform.python_version(),
    }
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(memory / 2**30, 1)
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except (OSError, ValueError, AttributeError):
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the numbers, plus shardkit's JPEG decoder."""
    from shardkit import __version__

    out: dict[str, str] = {"shardkit": __version__}  # also when run from a source tree
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        from shardkit.codec.decode import decode_backend

        out["shardkit_decoder"] = decode_backend()
    except Exception as err:  # report, never fail a benchmark over a version probe
        out["shardkit_decoder"] = f"unknown ({type(err).__name__})"
    return out


def gpu(device: str) -> dict[str, Any] | None:
    """Name, count and CUDA version when ``device`` is CUDA, else None."""
    if not device.startswith("cuda"):
        return None
    import torch

    return {"name": torch.cuda.get_device_name(torch.device(device)),
            "count": torch.cuda.device_count(), "cuda": torch.version.cuda}


def _describe_files(paths: list[str], sizes: list[int], *, sample: int, seed: int) -> dict[str, Any]:
    """Bytes and mean size of ``paths``; mean pixel count and formats of a seeded sample of them."""
    from PIL import Image

    present = [p for p, size in zip(paths, sizes, strict=True) if size >= 0]  # -1: could not stat
    sizes = [size for size in sizes if size >= 0]
    chosen = random.Random(seed).sample(present, min(sample, len(present)))
    kpix: list[float] = []
    modes: Counter[str] = Counter()
    for p in chosen:
        try:
            with Image.open(p) as im:
                kpix.append(im.width * im.height / 1000)
                modes[f"{im.format}/{im.mode}"] += 1
        except (OSError, SyntaxError, ValueError):  # unreadable: the pack skips it, and the bench says so
            modes["unreadable"] += 1
    n = max(len(sizes), 1)
    return {"images": len(paths), "bytes": sum(sizes), "mean_kb": round(sum(sizes) / n / 1000, 1),
            "mean_kpix": round(sum(kpix) / max(len(kpix), 1), 1),
            "formats_in_sample": dict(modes.most_common()), "sample_size": len(chosen)}


def describe_imagefolder(root: str, *, sample: int = 200, seed: int = 0) -> dict[str, Any]:
    """Count images, classes and bytes of an ImageFolder tree; mean pixel count of a sample.

    Example::

        describe_imagefolder("data/train")
        # {"images": 4000, "classes": 10, "mean_kpix": 190.3, ..., "class_names": ["cat", ...]}

    ``class_names`` and ``listing`` (what ``shardkit pack`` would read) are for
    :func:`~shardkit.bench.checks.check_same_data`; reports leave them out.
    """
    from shardkit.sources import scan_imagefolder

    listing = scan_imagefolder(root)
    files = _describe_files([s.path for s in listing.samples], [s.size for s in listing.samples],
                            sample=sample, seed=seed)
    return {"path": os.path.abspath(root), "classes": len(listing.classes or ()), **files,
            "class_names": list(listing.classes or ()), "listing": listing}


def describe_captions(source: str, *, sample: int = 200, seed: int = 0, quiet: bool = False) -> dict[str, Any]:
    """Count the images of a captioned source (a folder of sidecars, a table or a saved HF dataset,
    as ``pack_captions`` reads it; ``images`` includes those it would skip) and their bytes; mean
    pixel count of a sample of the local ones (``kind``: ``"captions"``). ``quiet``: without the
    scan's warnings about the source (a pack that scans it next says them).

    Raises:
        SourceError: not a captioned source (see :func:`shardkit.pack.pack_captions`).
    """
    from shardkit.sources import scan_caption_folder, scan_caption_table
    from shardkit.sources.hf import is_hf_dataset, scan_hf_dataset
    from shardkit.sources.table import is_table
    from shardkit.storage import is_remote

    said = logging.getLogger("shardkit.pack.sources")
    level = said.level
    if quiet:
        said.setLevel(logging.ERROR)
    try:
        if is_table(source):
            listing = scan_caption_table(source)
        elif is_hf_dataset(source):
            listing = scan_hf_dataset(source)
        else:
            listing = scan_caption_folder(source)
    finally:
        said.setLevel(level)
    local = [s for s in listing.samples if not is_remote(s.path) and os.path.isfile(s.path)]
    files = _describe_files([s.path for s in local], [os.path.getsize(s.path) for s in local], sample=sample,
                            seed=seed)
    return {"path": os.path.abspath(source), "kind": "captions", "classes": 0, **files,
            "images": len(listing.samples) + len(listing.warnings), "paths": [s.path for s in local]}


def describe_coco(images: str, annotations: str, *, sample: int = 200, seed: int = 0) -> dict[str, Any]:
    """Count the images of a COCO source that have annotations (what ``pack_coco(drop_empty=True)``
    packs and the CocoDetection baseline reads), their boxes and bytes; its category ids
    (in the order of ShardLoader's ``contiguous_labels``: label k is the k-th);
    mean pixel count of a sample.

    Raises:
        SourceError: the images folder or the annotations file is not a COCO source.
    """
    from shardkit.loader.routes.coco.target import contiguous_label_map
    from shardkit.sources import scan_coco

    listing = scan_coco(images, annotations, drop_empty=True)
    samples = listing.samples
    boxes = sum(len((s.meta or {}).get("annotations") or ()) for s in samples)
    files = _describe_files([s.path for s in samples], [s.size for s in samples], sample=sample, seed=seed)
    return {"kind": "coco", "path": os.path.abspath(images), "annotations": os.path.abspath(annotations),
            "classes": len(listing.categories or ()),
            "category_ids": list(contiguous_label_map(listing.categories)), "annotations_count": boxes,
            "boxes_per_image": round(boxes / max(len(samples), 1), 2), **files}


def warm_page_cache(paths: Iterable[str]) -> int:
    """Read every file once so the page cache holds it; returns the bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


def drop_page_cache() -> str | None:
    """Flush dirty pages and drop the page cache (needs root and a writable ``/proc/sys``).

    Returns None on success, else why it could not (the cache then stays as it was).
    """
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as err:
        return f"{type(err).__name__}: {err.strerror or err}"
    return None


def files_under(root: str) -> list[str]:
    """All regular files below ``root``, sorted."""
    return sorted(str(p) for p in Path(root).rglob("*") if p.is_file())
