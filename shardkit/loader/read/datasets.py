"""The datasets a loader reads: one packed dataset, or several mixed (see :mod:`~shardkit.loader.epochs.mix`).

A mix must be of one kind (all ImageFolder, all COCO or all captioned) and its labels must mean one thing:
ImageFolder datasets have equal class lists, unless ``disjoint_labels=True``, where dataset ``i``'s
labels are offset by the class counts of the datasets before it and the loader's classes are
the lists one after another; COCO datasets have equal categories (their labels are category ids).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardkit.errors import LoaderError
from shardkit.index.manifest import Manifest
from shardkit.index.manifest_io import locate_dataset, read_manifest
from shardkit.index.shards import ShardTable
from shardkit.loader.epochs.mix import Mix, check_weights
from shardkit.loader.epochs.state import dataset_identity
from shardkit.loader.read.reader import ReaderPart

log = logging.getLogger("shardkit.loader")

__all__ = ["Datasets", "open_datasets"]


@dataclass(frozen=True)
class Datasets:
    """What a loader reads. ``manifest``: the dataset's ``index.json``, or for a mix a joined
    view (its kind, classes and categories, and every shard in the joined order, each ``url``
    relative to its own dataset); ``manifests``: each dataset's; ``parts``: for the reader;
    ``mix``: None for one dataset."""

    urls: tuple[str, ...]
    manifest: Manifest
    manifests: tuple[Manifest, ...]
    parts: tuple[ReaderPart, ...]
    mix: Mix | None

    @property
    def identity(self) -> str:
        """What a resume state is bound to: the shards' hashes, dataset by dataset (see
        :func:`~shardkit.loader.epochs.state.dataset_identity`)."""
        return dataset_identity([m.table.fingerprint for m in self.manifests])

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64]:
        """Every shard's sample count, in the joined order."""
        return self.manifest.table.num_samples


def _urls(dataset: object) -> tuple[str, ...]:
    if isinstance(dataset, (str, os.PathLike)):
        dataset = (dataset,)
    elif isinstance(dataset, (bytes, bytearray)):  # a Sequence of ints: said whole, not as its first byte
        raise LoaderError(f"dataset must be a str path or URL, got bytes {bytes(dataset)!r} (os.fsdecode() it)"[:200])
    elif not isinstance(dataset, Sequence) or not dataset:
        raise LoaderError(f"dataset must be a path or URL, or a non-empty list of them, got {dataset!r}"[:200])
    for item in dataset:
        if not isinstance(item, (str, os.PathLike)):
            raise LoaderError(f"each dataset must be a path or URL, got {item!r}"[:200])
        if not os.fspath(item):
            raise LoaderError("dataset is an empty path: name a packed dataset's directory, index.json or URL")
    return tuple(os.fspath(d) for d in dataset)


def open_datasets(dataset: str | Sequence[str], *, weights: Iterable[object] | None, disjoint_labels: bool,
                  storage_options: dict[str, Any] | None, cache_dir: str | None = None,
                  absolute: bool = False) -> Datasets:
    """Read the manifests of ``dataset`` (a path or URL, or a list of them) and check that they mix.

    ``absolute``: local paths are made absolute (the reader travels to processes that run in
    another directory: a preprocessing service's workers).

    ``cache_dir``: where a remote dataset's ``index.table`` is kept for the node's other
    processes (read once per node; see :func:`~shardkit.index.manifest_io.read_manifest`).

    Raises:
        LoaderError: no datasets, bad weights, datasets of different kinds, class lists or
            categories that differ (naming both datasets and the first difference), or
            ``disjoint_labels`` where it cannot apply (COCO, or a dataset without class names).
        ManifestError: a dataset without a valid ``index.json``.
    """
    urls = _urls(dataset)
    if absolute:
        urls = tuple(url if "://" in url else os.path.abspath(os.path.expanduser(url)) for url in urls)
    stores = [locate_dataset(url, storage_options) for url in urls]
    manifests = tuple(read_manifest(store, cache_dir=cache_dir) for store in stores)
    if len(urls) == 1:
        if weights is not None and check_weights(weights, 1, urls) != [1]:
            log.warning("shardkit: weights on one dataset change nothing: an epoch holds each of its samples "
                        "once whatever its weight (weights set the datasets' shares of a mix)")
        if disjoint_labels:
            log.warning("shardkit: disjoint_labels changes nothing on one dataset (it offsets the labels of "
                        "the datasets after the first in a mix)")
        return Datasets(urls, manifests[0], manifests, (ReaderPart(stores[0], manifests[0].table),), None)
    first: dict[str, str] = {}
    for url, store in zip(urls, stores, strict=True):
        where = store.url if "://" in store.url else os.path.realpath(store.url)
        if where in first:
            log.warning("shardkit: %s and %s are the same dataset: the mix reads each of its samples once for "
                        "each time it is listed (weights set a dataset's share)", first[where], url)
        first.setdefault(where, url)
    for url, m in zip(urls[1:], manifests[1:], strict=True):
        if m.kind != manifests[0].kind:
            raise LoaderError(f"cannot mix datasets of different kinds: {urls[0]} is {manifests[0].kind!r}, "
                              f"{url} is {m.kind!r}")
    offsets, classes = _labels(urls, manifests, disjoint_labels)
    parts = tuple(ReaderPart(store, m.table, offset, len(m.classes or ()) if disjoint_labels else None)
                  for store, m, offset in zip(stores, manifests, offsets, strict=True))
    mix = Mix([m.table.num_samples for m in manifests], weights, names=urls)
    joined = Manifest(kind=manifests[0].kind, shards=ShardTable.join([m.table for m in manifests]),
                      classes=classes, categories=manifests[0].categories)
    return Datasets(urls, joined, manifests, parts, mix)


def _labels(urls: Sequence[str], manifests: Sequence[Manifest],
            disjoint: bool) -> tuple[list[int], tuple[str, ...] | None]:
    """Each dataset's label offset and the mix's class names; refuses labels that would clash."""
    first, name = manifests[0], urls[0]
    if first.kind == "captions":
        if disjoint:
            raise LoaderError("disjoint_labels is for ImageFolder datasets; captioned images have no labels")
        return [0] * len(manifests), None
    if first.kind == "coco":
        if disjoint:
            raise LoaderError("disjoint_labels is for ImageFolder datasets; COCO labels are category ids, so a "
                              "COCO mix needs the same categories in every dataset")
        for url, m in zip(urls[1:], manifests[1:], strict=True):
            if m.categories != first.categories:
                diff = _first_difference(name, first.categories, url, m.categories, ("category", "categories"))
                raise LoaderError(f"cannot mix COCO datasets with different categories: {diff}")
        return [0] * len(manifests), first.classes
    if not disjoint:
        for url, m in zip(urls[1:], manifests[1:], strict=True):
            if m.classes != first.classes:
                shared = sorted(set(first.classes or ()) & set(m.classes or ()))
                named = repr(shared[0]) + ("…" if len(shared) > 1 else "") if shared else ""
                advice = (f"they share {len(shared)} class name{'s' * (len(shared) > 1)} ({named}), which "
                          "disjoint_labels=True would make classes of their own: to train each as one class, pack "
                          "every dataset with the same class folders (shardkit pack --allow-empty keeps those "
                          "without images)") if shared else (
                          "pass disjoint_labels=True to give each dataset its own labels, offset by the classes "
                          "of the datasets before it")
                raise LoaderError(f"class lists differ: {_first_difference(name, first.classes, url, m.classes)}; "
                                  f"labels would mean different classes ({advice})")
        return [0] * len(manifests), first.classes
    offsets, total = [], 0
    for url, m in zip(urls, manifests, strict=True):
        if not m.classes:
            raise LoaderError(f"disjoint_labels needs every dataset's class names; {url} has none "
                              "(shards indexed without them)")
        offsets.append(total)
        total += len(m.classes)
    names = [c for m in manifests for c in m.classes or ()]
    repeated = sorted(c for c, n in Counter(names).items() if n > 1)  # one pass: class lists run to 21k names
    if repeated:
        log.warning("shardkit: disjoint_labels: %d class name%s appear%s in more than one dataset (%s), each time a "
                    "class of its own label; to train them as one class, pack every dataset with the same class "
                    "folders (shardkit pack --allow-empty) and mix without disjoint_labels", len(repeated),
                    "s" * (len(repeated) > 1), "" if len(repeated) > 1 else "s", ", ".join(map(repr, repeated[:5])))
    return offsets, tuple(names)


def _first_difference(a: str, xs: Sequence[Any] | None, b: str, ys: Sequence[Any] | None,
                      what: tuple[str, str] = ("class", "classes")) -> str:
    """``a`` and ``b``'s lists compared: the first entry that differs, or their lengths."""
    if xs is None or ys is None:
        return f"{a} has {'no' if xs is None else len(xs)} {what[1]}, {b} has {'no' if ys is None else len(ys)}"
    for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
        if x != y:
            if isinstance(x, Mapping) and isinstance(y, Mapping):  # a COCO category: name the fields that differ
                keys = sorted(str(k) for k in x.keys() | y.keys() if x.get(k, _ABSENT) != y.get(k, _ABSENT))
                shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
                return f"{what[0]} {i} is {_brief(x)} in {a} and {_brief(y)} in {b}, which differ in {shown}"
            return f"{what[0]} {i} is {x!r} in {a} but {y!r} in {b}"
    longer, extra = (a, xs) if len(xs) > len(ys) else (b, ys)
    return f"{a} has {len(xs)} {what[1]}, {b} has {len(ys)} ({longer} adds {_brief(extra[min(len(xs), len(ys))])})"


#: A field one category has and the other lacks (a field set to None is there).
_ABSENT = object()


def _brief(entry: Any) -> str:
    """A class name, or a COCO category by its id and name (not its keypoints and skeleton)."""
    if isinstance(entry, Mapping):
        return repr({k: entry[k] for k in ("id", "name") if k in entry})
    return repr(entry)
