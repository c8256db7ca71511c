"""``shardkit verify DST``: re-hash and re-read every shard against the manifest."""

from __future__ import annotations

import sys

import click

from shardkit.cli.storage import storage_option_flag, storage_options
from shardkit.index import locate_dataset, verify_dataset


@click.command("verify")
@click.argument("dataset")
@click.option("--decode", is_flag=True, help="Also decode every image.")
@click.option("--quiet", "-q", is_flag=True, help="Print problems only.")
@storage_option_flag
def verify_command(dataset: str, decode: bool, quiet: bool, storage_option: tuple[str, ...]) -> None:
    """Check the packed DATASET against its index.json; exit 1 on any mismatch."""
    options = storage_options(storage_option, dataset)
    store = locate_dataset(dataset, options)
    report = verify_dataset(store.url, decode=decode, storage_options=options)
    for problem in report.problems:
        click.secho(f"FAIL {problem}", fg="red", err=True)
    if not report.ok:
        click.echo(f"{len(report.problems)} problem(s) in {store.url}", err=True)
        sys.exit(1)
    if not quiet:
        decoded = f", {report.images_decoded:,} images decoded" if decode else ""
        click.echo(f"OK {store.url}: {report.shards_checked} shards, {report.samples_checked:,} samples{decoded}")
