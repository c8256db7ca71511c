"""ImageFolder trees, enumerated exactly as ``torchvision.datasets.ImageFolder`` does.

Classes are the sorted sub-directories of the root (``os.scandir``, following links); samples
are the files under each class directory (``os.walk`` with ``followlinks=True``, sorted) whose
lower-cased name ends with one of torchvision's image extensions. Two departures, both reported as
skipped inputs: a folder that cannot be read (``os.walk`` passes over it without a word), and a link
back to a folder above it, which is not followed (``os.walk`` follows it until the path is too
long: each image found dozens of times, or a walk that never ends). The root may be an fsspec URL
(``s3://bucket/train``): the same rules over the object listing (a class is a prefix holding
objects) give the same samples, order and labels as the same tree on disk.
"""

from __future__ import annotations

import logging
import os
import posixpath
from typing import Any

from shardkit.errors import SourceError
from shardkit.format.spec import IMAGE_EXTENSIONS
from shardkit.sources.base import SourceListing, SourceSample, source_name
from shardkit.sources.files import Files
from shardkit.sources.open import open_files

_SUFFIXES = tuple("." + e for e in IMAGE_EXTENSIONS)

log = logging.getLogger("shardkit.pack.sources")


def find_classes(files: Files) -> list[str]:
    """Sorted class directory names under ``files.root`` (torchvision's ``find_classes``)."""
    classes = files.subdirs()
    if not classes:
        raise SourceError(
            "no class folders found: an ImageFolder tree is ROOT/<class>/<image files>" + _loose_images(files),
            where=files.root,
        )
    return classes


def _loose_images(files: Files) -> str:
    """What to say of image files lying directly in a local ``files.root`` (none said for a URL)."""
    if files.remote or not os.path.isdir(files.root):
        return ""
    try:
        names = set(os.listdir(files.root))
    except OSError:
        return ""
    images = [n for n in names if n.lower().endswith(_SUFFIXES)]
    if not images:
        return ""
    captioned = sum(posixpath.splitext(n)[0] + ".txt" in names for n in images)
    if captioned:
        some = "its image has" if len(images) == 1 else f"{captioned:,} of its {len(images):,} images have"
        return f"; {some} a .txt caption beside it: pack captioned images with --format captions"
    some = "its image lies" if len(images) == 1 else f"its {len(images):,} images lie"
    return f"; {some} directly in it: put each class's images in a folder of its own"


#: Class folders named in a refusal, before "and N more".
_NAMED = 5


def scan_imagefolder(root: str, *, storage_options: dict[str, Any] | None = None,
                     allow_empty: bool = False) -> SourceListing:
    """List an ImageFolder tree: same samples, order and labels as torchvision's ImageFolder.

    Args:
        root: a local directory, or an fsspec URL (``s3://bucket/train``, ``memory://…``).
        storage_options: fsspec options for a URL ``root`` (credentials, endpoint).
        allow_empty: keep class folders without an image file as classes of no sample, as
            ``ImageFolder(allow_empty=True)`` does (a subset of a dataset's classes, packed with
            the whole class list, mixes with the whole dataset without renumbering).

    Raises:
        SourceError: ``root`` is missing, not a directory, has no class folders, or a class
            folder holds no image file without ``allow_empty`` (torchvision refuses those too),
            or no class folder holds one.
        StorageError: a URL ``root`` cannot be listed (missing bucket, network, credentials).

    Example::

        listing = scan_imagefolder("data/train")
        listing.classes[listing.samples[0].label]
    """
    files = open_files(root, storage_options)
    classes = find_classes(files)
    samples: list[SourceSample] = []
    warnings: list[dict[str, str]] = []
    empty: list[str] = []
    captioned = 0
    for label, (name, entries) in enumerate(zip(classes, files.walk(classes), strict=True)):
        for e in entries:
            if e.problem and e.rel == name:  # the class folder itself
                raise SourceError(f"class folder {name}: {e.problem}", where=files.root)
        warnings.extend({"source": source_name(e.rel), "reason": e.problem} for e in entries if e.problem)
        images = [e for e in entries if not e.problem and e.rel.lower().endswith(_SUFFIXES)]
        samples.extend(SourceSample(e.path, source_name(e.rel), e.size, label, version=e.version)
                       for e in images)
        captions = {e.rel[:-4] for e in entries if not e.problem and e.rel.endswith(".txt")}
        captioned += sum(posixpath.splitext(e.rel)[0] in captions for e in images)
        if not images:
            empty.append(name)
    if empty:
        shown = ", ".join(empty[:_NAMED]) + (f" and {len(empty) - _NAMED:,} more" if len(empty) > _NAMED else "")
        if len(empty) == len(classes) > 1:
            raise SourceError(f"none of its {len(classes):,} folders holds an image file ({shown}): an ImageFolder "
                              "tree is a folder of class folders of images", where=files.root)
        if not allow_empty or len(empty) == len(classes):
            more = "" if allow_empty else " (pack --allow-empty, allow_empty=True, keeps them as classes of no sample)"
            raise SourceError(f"no image files in class folder{'s' * (len(empty) > 1)} {shown}{more}",
                              where=files.root)
        log.info("shardkit: %s: class folder%s without an image file kept as classes of no sample: %s",
                 files.root, "s" * (len(empty) > 1), shown)
    if captioned * 2 >= len(samples):  # img2dataset's layout read as classes: its captions would be lost
        log.warning("shardkit: %s: %s of %s images have a .txt caption beside them, which an ImageFolder pack "
                    "leaves out (each folder is a class); pack with --format captions to keep them",
                    files.root, f"{captioned:,}", f"{len(samples):,}")
    return SourceListing(kind="imagefolder", root=files.root, samples=samples, classes=classes,
                         warnings=warnings, files=files)
