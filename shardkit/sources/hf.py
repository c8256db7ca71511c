"""HF ``datasets`` image datasets as a pack source: a dataset saved with ``save_to_disk`` (a
``Dataset``, or a ``DatasetDict`` and one of its splits), one sample per row, in row order.
Image–text pairs (:func:`scan_hf_dataset`) become captioned shards; images with a ``ClassLabel``
column (:func:`scan_hf_labelled`, what ``load_dataset("imagefolder")`` and most image
classification sets give) become labelled ones, the ``ClassLabel``'s names the classes.

The image column is an ``Image`` feature (its stored bytes are packed as they are, or the file
its ``path`` names when it holds no bytes); the caption column is text; the extra columns
(default: every other column that is not an image, audio or video) go into each sample's ``json``.
A sample's ``source`` is the image's stored ``path`` (its original file name) when it has one,
else ``row N`` (the first row is row 1). Rows are planned by count, like a table's.

Every pack process opens the dataset itself (``load_from_disk`` maps the Arrow files; nothing is
copied) and reads its rows' images from it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Generator, Sequence
from typing import Any

from shardkit.errors import SourceError
from shardkit.sources.base import SourceListing, SourceSample
from shardkit.sources.captions import CAPTIONS_KIND
from shardkit.sources.files import FileEntry, Files, SkipSample
from shardkit.sources.local import read_local
from shardkit.sources.table import json_value

__all__ = ["HFRows", "hf_is_labelled", "is_hf_dataset", "scan_hf_dataset", "scan_hf_labelled"]

_MEDIA = ("Image", "Audio", "Video")
_CAPTION_COLUMNS = ("caption", "text", "txt")


def is_hf_dataset(path: str) -> bool:
    """Whether ``path`` is a local directory written by ``Dataset.save_to_disk`` or
    ``DatasetDict.save_to_disk``."""
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json")))


def _saved_features(path: str, split: str | None = None) -> dict[str, Any]:
    """The features of a saved dataset as its ``dataset_info.json`` gives them (a DatasetDict's:
    those of ``split``, else of its first split), without opening it; {} where they cannot be read."""
    folder = path
    try:
        if os.path.isfile(os.path.join(path, "dataset_dict.json")):
            with open(os.path.join(path, "dataset_dict.json"), encoding="utf-8") as f:
                splits = json.load(f)["splits"]
            folder = os.path.join(path, split if split is not None and split in splits else str(splits[0]))
        with open(os.path.join(folder, "dataset_info.json"), encoding="utf-8") as f:
            features = json.load(f).get("features") or {}
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def hf_is_labelled(path: str, split: str | None = None) -> bool:
    """Whether the saved HF dataset at ``path`` (its ``split``, in a DatasetDict) holds labelled
    images: a ``ClassLabel`` column and none of the caption columns (``caption``, ``text``, ``txt``)."""
    features = _saved_features(path, split)
    kinds = {name: f.get("_type") if isinstance(f, dict) else None for name, f in features.items()}
    return "ClassLabel" in kinds.values() and not any(c in kinds for c in _CAPTION_COLUMNS)


def _files_version(root: str) -> str:
    """A digest of the saved dataset's files (names, sizes, modification times): an unfinished
    pack does not resume over a dataset saved again since."""
    h = hashlib.sha256()
    for dirpath, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            st = os.stat(os.path.join(dirpath, name))
            h.update(f"{os.path.relpath(os.path.join(dirpath, name), root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _open(root: str, split: str | None) -> Any:
    """The ``datasets.Dataset`` saved at ``root`` (a split of a saved ``DatasetDict``)."""
    try:
        import datasets
    except ImportError as err:
        raise SourceError("reading a HF dataset needs the datasets package (pip install datasets)",
                          where=root) from err
    try:
        loaded = datasets.load_from_disk(root)
    except (FileNotFoundError, ValueError, OSError) as err:
        raise SourceError(f"cannot open the saved HF dataset ({err})", where=root) from err
    except IndexError:  # datasets' load_from_disk on a dataset saved with no row
        raise SourceError("the saved HF dataset holds no rows", where=root) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            raise SourceError(f"a DatasetDict: name its split ({', '.join(loaded)}) with --split (split= in "
                              "Python)", where=root)
        if split not in loaded:
            raise SourceError(f"no split {split!r} in this DatasetDict (it has {', '.join(loaded)})", where=root)
        loaded = loaded[split]
    elif split is not None:
        raise SourceError(f"a Dataset has no splits (--split {split} applies to a saved DatasetDict)", where=root)
    return loaded.with_format(None)  # saved with_format("torch"), ("pandas"), ...: rows as Python values


class HFRows(Files):
    """The image bytes of a saved HF dataset's rows: sample ``path`` ``<root>#<row index>``.

    Example::

        rows = HFRows("saved/pairs", None, "image")
        next(rows.read_each([SourceSample("saved/pairs#0", "a.jpg", 0)]))
    """

    remote = False

    def __init__(self, root: str, split: str | None, column: str) -> None:
        self.root, self.split, self.column = root, split, column
        self._rows: Any = None

    def __repr__(self) -> str:
        return f"HFRows({self.root!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rows": None}  # each process maps the files itself

    def _images(self) -> Any:
        if self._rows is None:
            import datasets

            self._rows = _open(self.root, self.split).select_columns([self.column]).cast_column(
                self.column, datasets.Image(decode=False))
        return self._rows

    def is_dir(self) -> bool:
        return os.path.isdir(self.root)

    def subdirs(self) -> list[str]:
        raise SourceError("a HF dataset has rows, not folders", where=self.root)

    def walk(self, dirs: Sequence[str]) -> list[list[FileEntry]]:
        raise SourceError("a HF dataset has rows, not folders", where=self.root)

    def stat(self, rels: Sequence[str]) -> list[FileEntry]:
        raise SourceError("a HF dataset has rows, not files", where=self.root)

    def _read(self, sample: SourceSample) -> bytes | SkipSample:
        row = int(sample.path.rpartition("#")[2])
        image = self._images()[row][self.column]
        if image is None:
            return SkipSample("no image (the image column is null)")
        if image.get("bytes"):
            return bytes(image["bytes"])
        if image.get("path"):
            try:
                return read_local(image["path"])
            except SkipSample as skip:
                return skip
        return SkipSample("empty image (no bytes and no path)")

    def read_each(self, samples: Sequence[SourceSample]) -> Generator[bytes | SkipSample, None, None]:
        for sample in samples:
            yield self._read(sample)


def _image_column(features: dict[str, str], image_column: str | None, where: str) -> str:
    """The Image column: ``image_column`` checked, or the only one there is."""
    images = [name for name, kind in features.items() if kind == "Image"]
    if image_column is None:
        if len(images) != 1:
            raise SourceError(f"{len(images)} Image columns ({', '.join(images) or 'none'}): name one with "
                              "--image-column (image_column= in Python)", where=where)
        return images[0]
    if features.get(image_column) != "Image":
        raise SourceError(f"no Image column {image_column!r} (Image columns: {', '.join(images) or 'none'})",
                          where=where)
    return image_column


def _image_rows(ds: Any, image_column: str) -> tuple[list[str | None], list[int]]:
    """Each row's stored image path (None where it has none) and size in bytes, read from the
    Arrow column alone (no image's bytes copied): the stored bytes' length (from the offsets), else
    the size of the file its path names, else 0. The sizes size the shards (``max_size``) and tell
    a dataset saved again with other images from the one packed."""
    import pyarrow.compute as pc

    column = ds.with_format("arrow")[image_column]
    paths = list(pc.struct_field(column, "path").to_pylist())
    sizes = []
    for length, path in zip(pc.binary_length(pc.struct_field(column, "bytes")).to_pylist(), paths, strict=True):
        if length is None and path:
            try:
                length = os.stat(path).st_size
            except OSError:
                length = 0
        sizes.append(length or 0)
    return paths, sizes


def scan_hf_labelled(root: str, *, split: str | None = None, image_column: str | None = None,
                     label_column: str | None = None) -> SourceListing:
    """List the rows of a saved HF image dataset with a ``ClassLabel`` column as labelled samples
    (see the module doc): the label column's names are the classes, a row's label its class.

    Args:
        root: the directory ``save_to_disk`` wrote.
        split: the split of a saved ``DatasetDict``.
        image_column: the ``Image`` column (default: the only one).
        label_column: the ``ClassLabel`` column (default: the only one).

    Raises:
        SourceError: no such dataset or split, no single Image or ClassLabel column (naming
            the columns), or a label outside the ClassLabel's names.

    Example::

        listing = scan_hf_labelled("saved/beans", split="train")
    """
    root = os.path.normpath(root)
    ds = _open(root, split)
    where = root if split is None else f"{root} [{split}]"
    kinds = {name: type(feature).__name__ for name, feature in ds.features.items()}
    image_column = _image_column(kinds, image_column, where)
    labels = [name for name, kind in kinds.items() if kind == "ClassLabel"]
    ints = [name for name, feature in ds.features.items()
            if type(feature).__name__ == "Value" and str(getattr(feature, "dtype", "")).startswith(("int", "uint"))]
    cast = (f"; make an integer column one: dataset.class_encode_column(...), or cast_column(..., "
            f"ClassLabel(names=[...])), then save it again ({', '.join(ints)} holds integers)" if ints else "")
    if label_column is None:
        if len(labels) > 1:
            raise SourceError(f"{len(labels)} ClassLabel columns ({', '.join(labels)}): name one with --label-column "
                              "(label_column= in Python)", where=where)
        if not labels:
            raise SourceError(f"no ClassLabel column among {', '.join(kinds)}: a labelled dataset needs one{cast}",
                              where=where)
        label_column = labels[0]
    elif kinds.get(label_column) != "ClassLabel":
        raise SourceError(f"no ClassLabel column {label_column!r} (ClassLabel columns: {', '.join(labels) or 'none'})"
                          f"{cast}", where=where)
    classes = list(ds.features[label_column].names)
    version = _files_version(root)
    samples, warnings = [], []
    paths, sizes = _image_rows(ds, image_column)
    for i, (label, path, size) in enumerate(zip(ds[label_column], paths, sizes, strict=True)):
        rel = path or f"row {i + 1}"
        row = f"row {i + 1}: " if path else ""  # a source named by its row says it once
        if label is None or label < 0:  # datasets' -1: no label (a test split's)
            warnings.append({"source": rel, "reason": f"{row}no label (the {label_column!r} column is "
                                                      f"{'null' if label is None else label})"})
            continue
        if label >= len(classes):
            raise SourceError(f"row {i + 1}: label {label} is outside the {len(classes)} names of the ClassLabel "
                              f"column {label_column!r}", where=where)
        samples.append(SourceSample(f"{root}#{i}", rel, size, label=label, version=version))
    return SourceListing(kind="imagefolder", root=root, samples=samples, classes=classes, warnings=warnings,
                         files=HFRows(root, split, image_column))


def scan_hf_dataset(
    root: str,
    *,
    split: str | None = None,
    image_column: str | None = None,
    caption_column: str | None = None,
    extra_columns: Sequence[str] | None = None,
) -> SourceListing:
    """List the rows of a saved HF image–text dataset as captioned samples (see the module doc).

    Args:
        root: a directory written by ``save_to_disk``.
        split: the split of a saved ``DatasetDict`` (refused for a ``Dataset``).
        image_column: an ``Image`` column (default: the only one).
        caption_column: a text column (default: the first of ``caption``, ``text``, ``txt``).
        extra_columns: columns for the ``json`` (default: every other non-media column).

    Raises:
        SourceError: not a saved dataset, a split missing or not named, a column missing or of
            the wrong type, an extra value JSON cannot hold (naming the row and column).

    Example::

        listing = scan_hf_dataset("saved/coco_captions", split="train", caption_column="sentence")
    """
    ds = _open(root, split)
    where = root if split is None else f"{root} ({split})"
    features = {name: type(feature).__name__ for name, feature in ds.features.items()}
    image_column = _image_column(features, image_column, where)
    if caption_column is None:
        caption_column = next((c for c in _CAPTION_COLUMNS if c in features), None)
        if caption_column is None:
            labels = [c for c, kind in features.items() if kind == "ClassLabel"]
            labelled = (f"; its ClassLabel column {labels[0]!r} makes it a labelled dataset: pack it as one "
                        "(shardkit pack, --format imagefolder; pack() in Python)" if labels else "")
            raise SourceError(f"no caption column: none of caption, text, txt is there (columns: "
                              f"{', '.join(features)}); name it with --caption-column (caption_column= in Python)"
                              f"{labelled}", where=where)
    elif caption_column not in features:
        raise SourceError(f"no caption column {caption_column!r} (columns: {', '.join(features)})", where=where)
    if extra_columns is None:
        extras = [c for c, kind in features.items() if c not in (image_column, caption_column) and kind not in _MEDIA]
    else:
        extras = list(extra_columns)
        for name in extras:
            if name not in features or name in (image_column, caption_column) or features[name] in _MEDIA:
                raise SourceError(f"extra column {name!r} is missing, is the image or caption column, or holds "
                                  f"media (columns: {', '.join(features)})", where=where)
    version = _files_version(root)
    texts = ds[caption_column]
    values = {name: ds[name] for name in extras}
    paths, sizes = _image_rows(ds, image_column)
    samples, warnings = [], []
    for i, (text, path, size) in enumerate(zip(texts, paths, sizes, strict=True)):
        rel = path or f"row {i + 1}"
        if text is None:
            warnings.append({"source": rel, "reason": f"row {i + 1}: no caption (the caption column is null)"})
            continue
        if not isinstance(text, str):
            raise SourceError(f"row {i + 1}: the caption column {caption_column!r} holds {type(text).__name__} "
                              f"{text!r:.40}, not text", where=where)
        if not text.strip():
            warnings.append({"source": rel, "reason": f"row {i + 1}: no caption (the caption column is empty, "
                                                      "or only white space)"})
            continue
        meta = {name: json_value(v[i], i + 1, name, where) for name, v in values.items()}
        samples.append(SourceSample(f"{root}#{i}", rel, size, meta=meta, version=version, caption=text))
    return SourceListing(kind=CAPTIONS_KIND, root=root, samples=samples, warnings=warnings,
                         files=HFRows(root, split, image_column))
