"""Caption tables: a CSV, JSON Lines or Parquet file with one row per image: the image's path or
URL, its caption, and extra columns.

Samples are the rows, in the table's order. The image column holds a URL (any fsspec URL:
``https://``, ``s3://``, ...), an absolute path, or a path relative to ``images_root`` (default:
the table's own directory). The caption column is text; the extra columns (default: all the
others) go into each sample's ``json`` member, by column name.

Checked before anything is packed, each an error naming the table (and the row or column): the
table cannot be read or parsed; the image or caption column is missing (the message lists the
columns there are); an extra column is missing or is the image or caption column; a value is not
text where text is needed, or an extra value cannot be written as JSON (bytes, a date, NaN).
A row whose image or caption is empty (null) is not packed: it is listed in ``warnings`` as
``row N`` (the first data row is row 1) and counts as a skipped input.

Rows are planned by count, without their files' sizes (a URL's is not known before it is read):
``max_count`` cuts a table's shards, ``max_size`` does not; so a table gives the same shards and
``index.json`` whether its images are local files or URLs of the same files.
"""

from __future__ import annotations

import io
import logging
import math
import os
import posixpath
import re
from collections.abc import Sequence
from typing import Any

from shardkit.errors import SourceError, StorageError
from shardkit.sources.base import SourceListing, SourceSample
from shardkit.sources.captions import CAPTIONS_KIND
from shardkit.sources.linked import LinkedFiles, resolve
from shardkit.storage import Store, is_remote

__all__ = ["IMAGE_COLUMNS", "CAPTION_COLUMNS", "TABLE_SUFFIXES", "is_table", "json_value", "read_table",
           "scan_caption_table"]

#: Table formats by file suffix (a ``.gz`` or other compression suffix is not read).
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
#: The image column when none is named: the first of these the table has.
IMAGE_COLUMNS = ("image", "url", "path", "file_name")
#: The caption column when none is named: the first of these the table has.
CAPTION_COLUMNS = ("caption", "text", "txt")

log = logging.getLogger("shardkit.pack.sources")


def is_table(path: str) -> bool:
    """Whether ``path`` names a caption table by its suffix (``.csv``, ``.tsv``, ``.jsonl``,
    ``.ndjson``, ``.parquet``).

    >>> is_table("laion/part-0.parquet"), is_table("images/")
    (True, False)
    """
    return posixpath.splitext(path.split("?", 1)[0].lower())[1] in TABLE_SUFFIXES


def _read_bytes(path: str, storage_options: dict[str, Any] | None) -> bytes:
    if is_remote(path):
        scheme, rest = path.split("://", 1)
        parent, _, name = rest.rpartition("/")
        if not parent or not name:
            raise SourceError("not the URL of a file", where=path)
        try:
            return Store(f"{scheme}://{parent}", storage_options).read_bytes(name)
        except StorageError as err:
            if isinstance(err.__cause__, FileNotFoundError):
                raise SourceError("table does not exist", where=path) from err
            raise
    local = path.removeprefix("file://")
    try:
        with open(local, "rb") as f:
            return f.read()
    except FileNotFoundError as err:
        raise SourceError("table does not exist", where=path) from err
    except IsADirectoryError as err:
        raise SourceError("is a directory, not a table file", where=path) from err
    except OSError as err:
        raise SourceError(f"cannot read table: {err.strerror or err}", where=path) from err


def read_table(path: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The table at ``path`` as a ``pyarrow.Table`` (CSV and TSV columns all as text).

    Raises:
        SourceError: not a known suffix, missing, unreadable or not parseable (naming the file).
    """
    fmt = TABLE_SUFFIXES.get(posixpath.splitext(path.split("?", 1)[0].lower())[1])
    if fmt is None:
        raise SourceError(f"not a caption table (expected a file ending in {', '.join(TABLE_SUFFIXES)})",
                          where=path)
    try:
        import pyarrow as pa
        import pyarrow.csv as pa_csv
        import pyarrow.json as pa_json
        import pyarrow.parquet as pq
    except ImportError as err:
        raise SourceError("reading a caption table needs pyarrow (pip install pyarrow)", where=path) from err
    raw = _read_bytes(path, storage_options)
    try:
        if fmt == "parquet":
            table = pq.read_table(io.BytesIO(raw))
        elif fmt == "jsonl":
            table = pa_json.read_json(io.BytesIO(raw))
        else:  # every CSV column read as text: a caption "1984" stays a caption, a path stays a path
            delimiter = "\t" if fmt == "tsv" else ","
            # a quoted caption may span lines: without newlines_in_values pyarrow cuts its blocks
            # (1 MB) at any newline, and a row cut inside such a caption fails to parse or, if the
            # parts look like rows, is read as two wrong rows
            parse = pa_csv.ParseOptions(delimiter=delimiter, newlines_in_values=True)
            with pa_csv.open_csv(io.BytesIO(raw), parse_options=parse) as head:
                names = head.schema.names
            # a last row of our own: a quote that never closes takes it into its cell (pyarrow,
            # as Python's csv, reads such a cell to the end of the file)
            ended = raw if raw.endswith((b"\n", b"\r")) else raw + b"\n"
            table = pa_csv.read_csv(
                io.BytesIO(ended + (_END_ROW + delimiter * (len(names) - 1) + "\n").encode()), parse_options=parse,
                convert_options=pa_csv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                      strings_can_be_null=False))
            if table.num_rows == 0 or table.column(0)[-1].as_py() != _END_ROW:
                unclosed = _unclosed_quote(raw, delimiter) or 'a quoted cell opens and never closes (a stray " ?)'
                raise SourceError(f"cannot parse the {fmt} table ({unclosed})", where=path)
            table = table.slice(0, table.num_rows - 1)
    except (pa.ArrowInvalid, OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if fmt == "jsonl":  # pyarrow's rows count from 0, and a cut line reads as a type change
            first = _jsonl_problem(raw) or first
        elif fmt in ("csv", "tsv") and (raw[:2] in UTF16_BOMS or "UTF8" in first):  # a 0-based column, no row
            first = _not_utf8(raw) or first
        elif fmt in ("csv", "tsv"):  # a row of too few cells may be one a stray quote ran into
            first = _unclosed_quote(raw, "\t" if fmt == "tsv" else ",") or first
        raise SourceError(f"cannot parse the {fmt} table ({first})", where=path) from err
    return table


#: The first cell of the row :func:`read_table` adds after a CSV or TSV table's own.
_END_ROW = "shardkit: the end of the table"


def _pick(columns: Sequence[str], given: str | None, defaults: Sequence[str], what: str, option: str,
          where: str) -> str:
    if given is not None:
        if given not in columns:
            raise SourceError(f"no {what} column {given!r} (columns: {', '.join(columns)})", where=where)
        return given
    for name in defaults:
        if name in columns:
            return name
    raise SourceError(f"no {what} column: none of {', '.join(defaults)} is there (columns: {', '.join(columns)}); "
                      f"name it with {option} ({option[2:].replace('-', '_')}= in Python)", where=where)


def json_value(value: Any, row: int, column: str, where: str) -> Any:
    """``value`` if it can be written as JSON (nested lists and objects too), else a SourceError."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SourceError(f"row {row}: column {column!r} holds {value}, which JSON cannot hold", where=where)
        return value
    if isinstance(value, list):
        return [json_value(v, row, column, where) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v, row, column, where) for k, v in value.items()}
    raise SourceError(f"row {row}: column {column!r} holds {type(value).__name__} {value!r:.40}, not written as JSON "
                      "(leave the column out with --extra-columns, or convert it)", where=where)


def scan_caption_table(
    table: str,
    *,
    image_column: str | None = None,
    caption_column: str | None = None,
    extra_columns: Sequence[str] | None = None,
    images_root: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> SourceListing:
    """List the rows of a caption table as captioned samples (see the module doc).

    Args:
        table: a ``.csv``, ``.tsv``, ``.jsonl``/``.ndjson`` or ``.parquet`` file (path or fsspec URL).
        image_column: the column of image paths or URLs (default: the first of
            :data:`IMAGE_COLUMNS` present).
        caption_column: the caption column (default: the first of :data:`CAPTION_COLUMNS` present).
        extra_columns: columns written into each sample's ``json`` (default: every other column;
            ``[]``: none).
        images_root: the directory or URL prefix relative image paths start from (default: the
            table's directory).
        storage_options: fsspec options for URLs (the table, the images).

    Raises:
        SourceError: see the module doc; every message names the table and the row or column.
        StorageError: a URL table cannot be read (network, credentials).

    Example::

        listing = scan_caption_table("pairs.parquet", image_column="url", caption_column="text")
    """
    data = read_table(table, storage_options)
    columns = list(data.column_names)
    image = _pick(columns, image_column, IMAGE_COLUMNS, "image", "--image-column", table)
    caption = _pick(columns, caption_column, CAPTION_COLUMNS, "caption", "--caption-column", table)
    if image == caption:
        raise SourceError(f"the image and caption columns are both {image!r}", where=table)
    extras = [c for c in columns if c not in (image, caption)] if extra_columns is None else list(extra_columns)
    for name in extras:
        if name in (image, caption):
            raise SourceError(f"extra column {name!r} is the {'image' if name == image else 'caption'} column",
                              where=table)
        if name not in columns:
            raise SourceError(f"no extra column {name!r} (columns: {', '.join(columns)})", where=table)
    if len(set(extras)) != len(extras):
        raise SourceError(f"an extra column is named twice ({', '.join(extras)})", where=table)
    base = images_root if images_root is not None else _parent(table)
    if images_root is not None and not is_remote(images_root) and not os.path.isdir(images_root.removeprefix("file://")):
        what = "is not a directory" if os.path.exists(images_root.removeprefix("file://")) else "does not exist"
        raise SourceError(f"{what}: it is where the table's relative image paths start", where=images_root)
    paths = data.column(image).to_pylist()
    texts = data.column(caption).to_pylist()
    extra_values = {name: data.column(name).to_pylist() for name in extras}
    warnings: list[dict[str, str]] = []
    rows: list[tuple[int, str, str, str, dict[str, Any]]] = []
    for i, (path, text) in enumerate(zip(paths, texts, strict=True)):
        row = i + 1
        for what, value in (("image", path), ("caption", text)):
            if value is not None and not isinstance(value, str):
                column = image if what == "image" else caption
                raise SourceError(f"row {row}: the {what} column {column!r} holds {type(value).__name__} "
                                  f"{value!r:.40}, not text", where=table)
        if not path:
            warnings.append({"source": f"row {row}", "reason": "no image (the image column is empty)"})
            continue
        if text is None or not text.strip():
            empty = "null" if text is None else "empty, or only white space"
            warnings.append({"source": path, "reason": f"row {row}: no caption (the caption column is {empty})"})
            continue
        meta = {name: json_value(values[i], row, name, table) for name, values in extra_values.items()}
        rows.append((row, path, resolve(path, base), text, meta))
    _say_repeats(table, rows)
    files = LinkedFiles(table, [full for _, _, full, _, _ in rows], storage_options)
    entries = files.stat([full for _, _, full, _, _ in rows])
    if entries and all(e.size < 0 for e in entries):  # the wrong root, not a few lost files
        where = "" if images_root is None else f" under {images_root}"
        raise SourceError(f"none of the {len(entries):,} images the table names exists{where} (e.g. {rows[0][2]!r}): "
                          "relative paths start at the table's folder, unless an images root is given (--images-root)",
                          where=table)
    # Size 0: rows are planned by count (a URL's size is not known before it is read), so a table
    # gives the same shards whether its images are files or URLs; the version still guards a resume.
    samples = [SourceSample(full, rel, 0, meta=meta, version=entry.version, caption=text)
               for (_, rel, full, text, meta), entry in zip(rows, entries, strict=True)]
    return SourceListing(kind=CAPTIONS_KIND, root=table, samples=samples, warnings=warnings, files=files)


def _say_repeats(table: str, rows: list[tuple[int, str, str, str, dict[str, Any]]]) -> None:
    """Warn of rows that repeat an earlier row's image (as resolved) and caption (each is still
    packed as a sample of its own, as img2dataset keeps them; an image with several captions is no
    repeat). Keeps a hash per distinct row, a count and three examples."""
    first: dict[int, int] = {}
    count = 0
    examples: list[str] = []
    for row, _path, full, text, _meta in rows:
        earlier = first.setdefault(hash((full, text)), row)
        if earlier != row:
            count += 1
            if len(examples) < 3:
                examples.append(f"row {row} repeats row {earlier}")
    if count:
        log.warning("shardkit: %s: %s %s the image and caption of an earlier row (%s%s); each is packed as a "
                    "sample of its own", table, f"{count:,}", "row repeats" if count == 1 else "rows repeat",
                    ", ".join(examples), ", …" if count > 3 else "")


def _parent(table: str) -> str:
    if is_remote(table):
        return table.rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(table.removeprefix("file://")))


#: The byte-order marks a UTF-16 file starts with (little and big endian).
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _not_utf8(raw: bytes) -> str | None:
    """Where a CSV or TSV table is not UTF-8 text, said by its line (the header is line 1; a quoted
    cell may span lines), or None.

    Example:
        >>> _not_utf8("image,caption\\na.jpg,ok\\nb.jpg,caf\\xe9\\n".encode("latin-1"))
        'not UTF-8 text: line 3 has the byte 0xe9; save the table as UTF-8'
        >>> _not_utf8("image,caption\\n".encode("utf-16"))
        'UTF-16 text; save the table as UTF-8'
    """
    if raw[:2] in UTF16_BOMS:
        return "UTF-16 text; save the table as UTF-8"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        newline = b"\n" if b"\n" in raw else b"\r"  # old Mac files end lines with CR alone
        line = raw.count(newline, 0, err.start) + 1
        return f"not UTF-8 text: line {line} has the byte 0x{raw[err.start]:02x}; save the table as UTF-8"
    return None


def _unclosed_quote(raw: bytes, delimiter: str) -> str | None:
    """Where a quoted cell of a CSV or TSV table opens and never closes, by line from 1 (a line
    ends at CR LF, LF or CR alone), or None.

    Example:
        >>> _unclosed_quote(b'image,caption\\na.jpg,"a cat\\nb.jpg,a dog\\n', ",")
        'line 2: a quoted cell opens and never closes (a stray " ?); the lines after it would be read as its text'
    """
    text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")  # pyarrow skips a BOM
    ends = re.compile(f"[{re.escape(delimiter)}\r\n]")
    i, n = 0, len(text)
    while i < n:  # i is at the start of a cell
        if text[i] == '"':
            j = i + 1
            while True:
                j = text.find('"', j)
                if j < 0:
                    line = len(re.findall(r"\r\n|\r|\n", text[:i])) + 1
                    return (f'line {line}: a quoted cell opens and never closes (a stray " ?); '
                            "the lines after it would be read as its text")
                if text.startswith('"', j + 1):  # "" inside a quoted cell
                    j += 2
                    continue
                break
            i = j + 1
        end = ends.search(text, i)
        if end is None:
            break
        i = end.end()
    return None


def _jsonl_problem(raw: bytes) -> str | None:
    """The first line of a JSON Lines table that is not a JSON object, or whose field changes type
    from the line before that has it (what pyarrow refuses), by line number from 1; None if none is found.

    >>> _jsonl_problem(b'{"caption": "a"}\\n{"caption": "b"\\n')
    "line 2: not JSON (Expecting ',' delimiter)"
    >>> _jsonl_problem(b'{"caption": "a"}\\n{"caption": 5}\\n')
    "line 2: field 'caption' is a number, on line 1 a string"
    """
    import json

    seen: dict[str, tuple[str, int]] = {}
    names = {str: "a string", int: "a number", float: "a number", bool: "true or false", list: "a list",
             dict: "an object"}
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            return f"line {number}: not JSON ({getattr(err, 'msg', err)})"
        if not isinstance(row, dict):
            return f"line {number}: not a JSON object"
        for key, value in row.items():
            if value is None:
                continue
            kind = names.get(type(value), type(value).__name__)
            if key in seen and seen[key][0] != kind:
                return f"line {number}: field {key!r} is {kind}, on line {seen[key][1]} {seen[key][0]}"
            seen.setdefault(key, (kind, number))
    return None
