"""``shardkit info DST``: what a packed dataset holds."""

from __future__ import annotations

import json

import click

from shardkit.cli.location import LOCATION
from shardkit.cli.report import (
    category_count,
    fit,
    human_bytes,
    label_width,
    print_annotations,
    print_drop_empty,
)
from shardkit.cli.storage import storage_option_flag, url_options
from shardkit.index import locate_dataset, read_manifest
from shardkit.pack.skips import describe_reasons


@click.command("info")
@click.argument("dataset", type=LOCATION)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@storage_option_flag
def info_command(dataset: str, as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Summarise the packed DATASET (directory, index.json path or URL)."""
    store = locate_dataset(dataset, url_options(storage_option, dataset))
    m = read_manifest(store)
    sizes = m.table.num_samples.tolist()  # by column: no shard hash is read
    summary = {
        "url": store.url, "kind": m.kind, "num_samples": m.num_samples, "num_shards": len(m.shards),
        "num_bytes": m.num_bytes, "num_classes": len(m.classes) if m.classes is not None else None,
        "num_categories": category_count(m.categories) if m.categories is not None else None,
        "skipped": len(m.skipped), "options": m.options, "created_by": m.created_by,
        "classes": list(m.classes) if m.classes is not None else None,  # label k is classes[k]
        "categories": (list({repr(c.get("id")): {"id": c.get("id"), "name": c.get("name")}  # one per id: its last
                             for c in m.categories}.values()) if m.categories is not None else None),
    }
    if "drop_empty" in m.extra:
        summary["drop_empty"] = m.extra["drop_empty"]
    if "annotation_report" in m.extra:
        summary["annotation_report"] = m.extra["annotation_report"]
    if as_json:
        click.echo(json.dumps(summary, indent=1))
        return
    w = label_width(m.categories)
    click.echo(f"{'dataset':<{w}}{store.url}  ({m.kind}, {m.created_by})")
    click.echo(f"{'samples':<{w}}{m.num_samples:,}")
    if m.classes is not None:
        click.echo(fit(f"{'classes':<{w}}{len(m.classes)}: {_names(list(m.classes))}", w))
    if m.categories is not None:
        by_id = {repr(c.get("id")): str(c.get("name", c.get("id"))) for c in m.categories}  # the last of an id
        names = list(by_id.values())
        click.echo(fit(f"{'categories':<{w}}{len(names)}: {_names(names)}", w))
    click.echo(f"{'shards':<{w}}{len(m.shards)}{_per_shard(sizes)}")
    click.echo(f"{'bytes':<{w}}{human_bytes(m.num_bytes)}")
    grouped = describe_reasons(m.skipped)
    click.echo(f"{'skipped':<{w}}{len(m.skipped)}" + (f": {grouped}" if grouped else ""))
    print_drop_empty(m.extra, w)
    report = m.extra.get("annotation_report")
    if isinstance(report, dict) and _annotation_report(report):  # what the pack said (left out when malformed)
        print_annotations(report, w)
    opts = {k: v for k, v in m.options.items() if k != "fingerprint"}
    click.echo(fit(f"{'options':<{w}}" + ", ".join(f"{k}={v}" for k, v in opts.items()), w))


def _annotation_report(report: object) -> bool:
    """Whether ``report`` is an annotation report as the pack writes it (an index.json edited by
    hand may hold anything: it is then not shown, rather than a traceback)."""
    counts = ("packed", "dropped", "kept_with_problems", "in_skipped_images")
    return (isinstance(report, dict) and all(type(report.get(k)) is int for k in counts)
            and isinstance(report.get("problems"), list)
            and all(isinstance(p, dict) and isinstance(p.get("source"), str) and isinstance(p.get("reason"), str)
                    for p in report["problems"]))


#: Class (or category) names listed in full up to this many; past it the first ones, and where all are.
LISTED = 100


def _names(names: list[str]) -> str:
    """``names`` in label order, all of them up to :data:`LISTED` (a person checks them against a
    model's); past that the first :data:`LISTED`, and how to get the rest."""
    if len(names) <= LISTED:
        return ", ".join(names)
    return ", ".join(names[:LISTED]) + f" … and {len(names) - LISTED:,} more (info --json lists them all)"


def _per_shard(sizes: list[int]) -> str:
    """The samples of each shard for the ``shards`` line: ``  (300 samples)`` for one shard,
    ``  (5 samples each)`` or ``  (4–5 samples each)`` for more, nothing for none."""
    if not sizes:
        return ""
    least, most = min(sizes), max(sizes)
    if len(sizes) == 1:
        return f"  ({most:,} sample{'' if most == 1 else 's'})"
    if least == most:
        return f"  ({most:,} sample{'' if most == 1 else 's'} each)"
    return f"  ({least:,}–{most:,} samples each)"
