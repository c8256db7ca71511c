"""What the commands print: sizes, and the summary of a pack (skipped inputs, annotations)."""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from shardkit.pack.annotations import ANNOTATION_REPORT
from shardkit.pack.skips import describe_reasons

if TYPE_CHECKING:
    from shardkit.pack import PackResult

#: Skipped inputs and annotation problems listed one per line; the rest are in index.json.
SHOWN = 10


def fit(text: str, indent: int) -> str:
    """``text`` wrapped to the terminal on stdout, its further lines indented ``indent`` columns
    (words are not broken: a long path stays whole); as it is when stdout is not a terminal,
    so scripts reading the output see one line per item."""
    if not sys.stdout.isatty():
        return text
    width = shutil.get_terminal_size().columns
    if width <= indent + 20 or len(text) <= width:
        return text
    return textwrap.fill(text, width=width, subsequent_indent=" " * indent, break_long_words=False,
                         break_on_hyphens=False)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` (with thousands separators) and ``noun``, in the plural (``plural``, else ``noun + "s"``)
    unless ``n`` is 1.

    >>> counted(1, "shard"), counted(1200, "sample"), counted(2, "class", "classes")
    ('1 shard', '1,200 samples', '2 classes')
    """
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


#: The width of a summary line's label column: wide enough for ``annotations`` where a COCO pack
#: has that line (:func:`label_width`).
LABEL = 10


def label_width(categories: object) -> int:
    """The label column's width for a summary: 12 for a COCO pack (its ``categories`` and
    ``annotations`` lines), else :data:`LABEL`."""
    return LABEL if categories is None else 12


def category_count(categories: Sequence[Any]) -> int:
    """How many categories ``categories`` (COCO records) define: their distinct ids (records that
    repeat an id are one category, as pycocotools and the loader's labels take them).

    >>> category_count([{"id": 1}, {"id": 3}, {"id": 3}])
    2
    """
    ids = set()
    for c in categories:
        cid = c.get("id") if isinstance(c, Mapping) else None
        ids.add(cid if isinstance(cid, (int, str)) else repr(cid))
    return len(ids)


def print_skipped(skipped: Sequence[Mapping[str, str]], *, err: bool = False, width: int = LABEL) -> None:
    """``skipped   N: <count> <kind>, …`` then the first :data:`SHOWN` entries by source (the
    same list whatever order parallel workers found them in)."""
    grouped = describe_reasons(skipped)
    click.echo(f"{'skipped':<{width}}{len(skipped):,}" + (f": {grouped}" if grouped else ""), err=err)
    for s in sorted(skipped, key=lambda s: _natural((s["source"], s["reason"])))[:SHOWN]:
        click.echo(f"  - {s['source']}: {s['reason']}", err=err)
    if len(skipped) > SHOWN:
        click.echo(f"  … {len(skipped) - SHOWN:,} more" + ("" if err else " in index.json"),
                   err=err)


def print_annotations(report: Mapping[str, Any], width: int = LABEL) -> None:
    """The COCO annotation line: packed, dropped, flagged but kept, lost with skipped images."""
    parts = [f"{report['dropped']:,} dropped"]
    if report["kept_with_problems"]:
        parts.append(f"{report['kept_with_problems']:,} kept, flagged")
    if report["in_skipped_images"]:
        parts.append(f"{report['in_skipped_images']:,} in skipped images")
    click.echo(f"{'annotations':<{width}}{report['packed']:,} packed; " + ", ".join(parts))
    problems = report["problems"]
    for p in problems[:SHOWN]:
        click.echo(f"  - {p['source']}: {p['reason']}")
    if len(problems) > SHOWN:
        click.echo(f"  … {len(problems) - SHOWN:,} more in index.json ({ANNOTATION_REPORT})")


def print_drop_empty(extra: Mapping[str, Any], width: int = LABEL) -> None:
    """The line saying how many COCO images ``--drop-empty`` left out (nothing for other packs)."""
    dropped = extra.get("drop_empty")
    if isinstance(dropped, Mapping) and isinstance(dropped.get("images"), int):
        n = dropped["images"]
        click.echo(f"{'dropped':<{width}}{n:,} image{'s' * (n != 1)} without annotations (--drop-empty)")


def print_pack_summary(result: PackResult, dst: str) -> None:
    """The summary a person reads after ``shardkit pack``."""
    m = result.manifest
    if result.already_complete:
        click.echo(f"{dst}: already packed from files of these names and sizes, with these options; nothing to "
                   f"do. No file was re-read: `shardkit verify {dst}` checks the shards' bytes, and --overwrite packs "
                   f"again a source file edited in place to the same size.")
    groups = (counted(category_count(m.categories), "category", "categories") if m.categories is not None
              else "captioned images" if m.kind == "captions" else counted(len(m.classes or ()), "class", "classes"))
    w = label_width(m.categories)
    click.echo(f"{'samples':<{w}}{m.num_samples:,}  ({groups})")
    reused = result.reused_shards and not result.already_complete
    click.echo(f"{'shards':<{w}}{len(m.shards):,}  in {result.url}"
               + (f"  ({result.reused_shards} reused from an interrupted run)" if reused else ""))
    click.echo(f"{'bytes':<{w}}{human_bytes(m.num_bytes)}")
    if result.ray_nodes:  # where the shards were written: did the cluster's nodes all take part?
        written = sum(result.ray_nodes.values())
        nodes = len(result.ray_nodes)
        per_node = ", ".join(f"{n:,} on {node[:8]}" for node, n in result.ray_nodes.items())
        click.echo(f"{'ray':<{w}}{written:,} shard{'s' * (written != 1)} written on {nodes} "
                   f"node{'s' * (nodes != 1)} ({per_node})")
    print_skipped(m.skipped, width=w)
    print_drop_empty(m.extra, w)
    report = m.extra.get(ANNOTATION_REPORT)
    if isinstance(report, Mapping):
        print_annotations(report, w)
    if not result.already_complete:
        fresh = f", {m.num_samples - result.reused_samples:,} packed by this run" if reused else ""
        click.echo(f"{'speed':<{w}}{result.images_per_second:,.0f} images/s  ({result.seconds:.1f} s{fresh})")


def _natural(texts: tuple[str, ...]) -> tuple[list[Any], ...]:
    """A sort key that puts numbers in order within text (``row 2`` before ``row 10``): per text,
    its runs of letters and of digits in turn (a text's list always starts with a letters run, so
    lists compare a str with a str and an int with an int).

    >>> sorted([("a", "row 10"), ("a", "row 2"), ("a1.jpg", "x"), ("b.jpg", "y")], key=_natural)
    [('a', 'row 2'), ('a', 'row 10'), ('a1.jpg', 'x'), ('b.jpg', 'y')]
    """
    return tuple([int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]
                 for text in texts)
