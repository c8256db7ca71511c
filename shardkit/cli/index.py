"""``shardkit index DIR``: adopt existing WebDataset shards as a shardkit dataset, in place."""

from __future__ import annotations

import posixpath
import shlex

import click

from shardkit.cli.location import LOCATION
from shardkit.cli.report import counted
from shardkit.cli.storage import storage_option_flag, url_options


def _class_names(path: str | None) -> list[str] | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8-sig") as f:  # a BOM (Notepad's UTF-8) is no part of a name
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as err:
        raise click.BadParameter(f"cannot read {path} as UTF-8 text ({err})",
                                 param_hint="--classes") from err
    while lines and not lines[-1]:  # blank lines at the end name no label
        lines.pop()
    if not lines:
        raise click.BadParameter(f"{path} lists no class names", param_hint="--classes")
    first: dict[str, int] = {}
    for number, name in enumerate(lines, start=1):
        if not name:
            raise click.BadParameter(f"{path}: line {number} is blank; line N names label N-1, so a blank line "
                                     "would move every label after it", param_hint="--classes")
        if name in first:
            raise click.BadParameter(f"{path}: {name!r} is on lines {first[name]} and {number}; class names "
                                     "must differ", param_hint="--classes")
        first[name] = number
    return lines


class _IndexCommand(click.Command):
    """``shardkit index``, telling ``shardkit index shards/*.tar`` (the shell's list of shards, which
    click refuses as "unexpected extra arguments") to name their folder instead."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        tars = [a for a in args if a.lower().endswith(".tar") and not a.startswith("-")]
        if len(tars) > 1 and "--help" not in args:  # DATASET is one folder, and no option takes a .tar
            folders = sorted({posixpath.dirname(a) or "." for a in tars})
            several = " (one folder at a time)" if len(folders) > 1 else ""
            raise click.UsageError(f"index takes the folder that holds the shards, not {len(tars)} shards: "
                                   f"shardkit index {shlex.quote(folders[0])}{several}", ctx=ctx)
        return super().parse_args(ctx, args)


@click.command("index", cls=_IndexCommand)
@click.argument("dataset", type=LOCATION)
@click.option("--classes", "classes_file", type=click.Path(exists=True, dir_okay=False),
              default=None,
              help="Text file of class names, one per line, in label order (line 1 is label 0).")
@click.option("--kind", type=click.Choice(["auto", "imagefolder", "captions"]), default="auto", show_default=True,
              help="What the samples hold: labelled images (cls) or captioned ones (txt, as img2dataset "
                   "writes); auto: from the first sample.")
@click.option("--dali-index", is_flag=True,
              help="Also write DALI index files (<shard>.dali.idx, wds2idx format).")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing index.json and .idx files beside the shards.")
@click.option("--table", "table_only", is_flag=True,
              help="Only write index.table and index.hashes from an existing index.json (a dataset packed "
                   "before they existed, or a table found stale); reads no shard.")
@storage_option_flag
def index_command(dataset: str, classes_file: str | None, kind: str, dali_index: bool, overwrite: bool,
                  table_only: bool, storage_option: tuple[str, ...]) -> None:
    """Index the WebDataset shards (*.tar) in DATASET (directory or URL) without rewriting them.

    Each sample needs one image member and a 'cls' label, or, captioned (img2dataset's shards), a
    'txt' caption; 'json' is optional and every member is kept. Writes index.json and offsets
    files so ShardLoader, info and verify work on the shards.

    On a DATASET that already has index.json (e.g. one shardkit packed), --dali-index alone adds
    DALI index files for its shards and changes nothing else; --table writes its shard table
    (index.table, index.hashes) from index.json.
    """
    from shardkit.index import locate_dataset, write_table
    from shardkit.index.adopt import adopt_shards
    from shardkit.index.dali import write_dali_indexes

    remote = url_options(storage_option, dataset)
    if table_only:
        if dali_index or overwrite or classes_file is not None:
            raise click.UsageError("--table takes no other option: it only writes the shard table")
        manifest = write_table(locate_dataset(dataset, remote))
        click.echo(f"{dataset}: wrote index.table and index.hashes for {counted(len(manifest.shards), 'shard')}")
        return
    if (dali_index and not overwrite and classes_file is None
        and locate_dataset(dataset, remote).exists("index.json")):
        names = write_dali_indexes(locate_dataset(dataset, remote).url, storage_options=remote)
        click.echo(f"{dataset}: already a dataset; wrote {counted(len(names), 'DALI index file')}")
        return
    if kind == "captions" and classes_file is not None:
        raise click.UsageError("--classes names the labels of labelled images, not of --kind captions")
    manifest = adopt_shards(dataset, classes=_class_names(classes_file), kind=kind, dali_index=dali_index,
                            overwrite=overwrite, storage_options=remote)
    what = ("captioned images" if manifest.kind == "captions"
            else counted(len(manifest.classes or ()), "class", "classes"))
    click.echo(f"indexed {dataset}: {counted(len(manifest.shards), 'shard')}, "
               f"{counted(manifest.num_samples, 'sample')}, {what}"
               + (", DALI index files written" if dali_index else ""))
