"""``shardkit verify DST``: re-hash and re-read every shard against the manifest."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator

import click

from shardkit.cli.location import LOCATION
from shardkit.cli.progress import Bar, bars_enabled
from shardkit.cli.report import counted
from shardkit.cli.storage import storage_option_flag, url_options
from shardkit.index import ShardEntry, locate_dataset, read_manifest, verify_dataset
from shardkit.index.manifest_io import StaleTable


@click.command("verify")
@click.argument("dataset", type=LOCATION)
@click.option("--decode", is_flag=True, help="Also decode every image.")
@click.option("--quiet", "-q", is_flag=True, help="Print problems only (no progress bar).")
@storage_option_flag
def verify_command(dataset: str, decode: bool, quiet: bool,
                   storage_option: tuple[str, ...]) -> None:
    """Check the packed DATASET against its index.json; exit 1 on any mismatch."""
    options = url_options(storage_option, dataset)
    store = locate_dataset(dataset, options)
    try:  # the bar's totals, from the table where it holds (verify_dataset judges it, and says so)
        manifest = read_manifest(store, strict_table=True)
    except StaleTable:
        manifest = read_manifest(store, table=False)
    shards = manifest.table
    done = 0  # the columns, not the entries: an entry's hash would read index.hashes, which verify judges
    with Bar(bars_enabled(quiet), desc="verifying" + (" + decoding" if decode else ""),
             total=int(shards.num_bytes.sum()), unit="B") as bar:

        def progress(entry: ShardEntry) -> None:
            nonlocal done
            done += 1
            bar.note(f"{done:,}/{len(shards):,} shards")
            bar.update(entry.num_bytes)

        report = verify_dataset(store.url, decode=decode, storage_options=options,
                                progress=progress)
    for problem in _grouped(report.problems):
        click.secho(f"FAIL {problem}", fg="red", err=True)
    if report.unindexed:
        first = report.unindexed[0] + (f" and {len(report.unindexed) - 1:,} more" if len(report.unindexed) > 1 else "")
        click.secho(f"WARN no offsets file (.idx) beside {counted(len(report.unindexed), 'shard')}: {first}; "
                    "the loader finds the samples of such a shard by reading it, and checks none against its CRC-32 "
                    "(copy the .idx files with the shards)", fg="yellow", err=True)
    if report.flagged:
        first = report.flagged[0] + (f" and {len(report.flagged) - 1:,} more" if len(report.flagged) > 1 else "")
        click.secho(f"WARN malformed segmentation in {counted(len(report.flagged), 'annotation')}: {first}; a loader "
                    "with masks=True replaces those images with others (the pack flagged them and kept them)",
                    fg="yellow", err=True)
    if report.unlisted:
        first = report.unlisted[0] + (f" and {len(report.unlisted) - 1:,} more" if len(report.unlisted) > 1 else "")
        them = "it" if len(report.unlisted) == 1 else "them"
        plain = all(name.endswith(".tar") for name in report.unlisted)  # not compressed, not .TAR
        how = (f"shardkit index --overwrite indexes {them} with the others" if manifest.adopted and plain else
               "shardkit index adopts shards made elsewhere, in a folder of their own, into a dataset of their own")
        click.secho(f"WARN {counted(len(report.unlisted), 'tar file')} beside the shards not in index.json: {first}; "
                    f"no loader reads {them} ({how})", fg="yellow", err=True)
    if not report.ok:
        click.echo(f"{len(report.problems)} problem(s) in {store.url}", err=True)
        sys.exit(1)
    if not quiet:
        decoded = f", {counted(report.images_decoded, 'image')} decoded" if decode else ""
        click.echo(f"OK {store.url}: {counted(report.shards_checked, 'shard')}, "
                   f"{counted(report.samples_checked, 'sample')}{decoded}")


#: Samples with the same problem printed in full before the rest are counted: a fault of the whole
#: dataset (an index.json edited by hand) would otherwise print a line for every sample.
SHOWN_PER_PROBLEM = 5


def _grouped(problems: list[str]) -> Iterator[str]:
    """``problems`` (``"<where>: <what>"``) in order, at most :data:`SHOWN_PER_PROBLEM` samples
    (``where`` is ``shard.tar:key``) of each ``what``, then one line per ``what`` counting the
    samples left out. A shard's own problem is always printed: each one names a file to mend."""
    seen: Counter[str] = Counter()
    for problem in problems:
        where, _sep, what = problem.partition(": ")
        if ".tar:" not in where:
            yield problem
            continue
        seen[what] += 1
        if seen[what] <= SHOWN_PER_PROBLEM:
            yield problem
    for what, count in seen.items():
        if count > SHOWN_PER_PROBLEM:
            yield f"{count - SHOWN_PER_PROBLEM:,} more samples: {what}"
