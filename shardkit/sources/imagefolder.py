"""ImageFolder trees, enumerated exactly as ``torchvision.datasets.ImageFolder`` does.

Classes are the sorted sub-directories of the root (``os.scandir``, following links); samples
are the files under each class directory (``os.walk`` with ``followlinks=True``, sorted) whose
lower-cased name ends with one of torchvision's image extensions.
"""

from __future__ import annotations

import os

from shardkit.errors import SourceError
from shardkit.format.spec import IMAGE_EXTENSIONS
from shardkit.sources.base import SourceListing, SourceSample, source_name

_SUFFIXES = tuple("." + e for e in IMAGE_EXTENSIONS)


def find_classes(root: str) -> list[str]:
    """Sorted class directory names under ``root`` (torchvision's ``find_classes``)."""
    try:
        with os.scandir(root) as entries:
            classes = sorted(e.name for e in entries if e.is_dir())
    except FileNotFoundError as err:
        raise SourceError("source directory does not exist", where=root) from err
    except NotADirectoryError as err:
        raise SourceError("source is not a directory (expected an ImageFolder tree)",
                          where=root) from err
    except OSError as err:
        raise SourceError(f"cannot list source directory: {err.strerror}", where=root) from err
    if not classes:
        raise SourceError(
            "no class folders found: an ImageFolder tree is ROOT/<class>/<image files>", where=root
        )
    return classes


def _stat(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, 0
    return st.st_size, st.st_mtime_ns


def scan_imagefolder(root: str) -> SourceListing:
    """List an ImageFolder tree: same samples, order and labels as torchvision's ImageFolder.

    Raises:
        SourceError: ``root`` is missing, not a directory, has no class folders, or a class
            folder holds no image file (torchvision refuses those too).

    Example::

        listing = scan_imagefolder("data/train")
        listing.classes[listing.samples[0].label]
    """
    root = os.path.expanduser(root)
    classes = find_classes(root)
    samples: list[SourceSample] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        count = len(samples)
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(_SUFFIXES):
                    path = os.path.join(dirpath, fname)
                    rel = source_name(os.path.relpath(path, root).replace(os.sep, "/"))
                    size, mtime_ns = _stat(path)
                    samples.append(SourceSample(path, rel, size, label, mtime_ns=mtime_ns))
        if len(samples) == count:
            empty.append(name)
    if empty:
        raise SourceError(f"no image files in class folder(s): {', '.join(empty)}", where=root)
    return SourceListing(kind="imagefolder", root=root, samples=samples, classes=classes)
