"""``shardkit pack SRC DST``."""

from __future__ import annotations

import os
import sys

import click

from shardkit.cli.report import human_bytes
from shardkit.cli.storage import storage_option_flag, storage_options
from shardkit.pack import Executor, PackOptions, pack, pack_coco, parse_size


def _size(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err


@click.command("pack")
@click.argument("src")
@click.argument("dst")
@click.option("--format", "fmt", type=click.Choice(["auto", "imagefolder", "coco"]), default="auto", show_default=True,
              help="Input layout; auto: coco when --annotations is given, else imagefolder.")
@click.option("--annotations", type=click.Path(dir_okay=False), default=None,
              help="COCO instances JSON (SRC is then the images folder).")
@click.option("--drop-empty", is_flag=True, help="COCO: leave out images without annotations.")
@click.option("--max-count", default=1000, show_default=True, type=click.IntRange(min=1), help="Samples per shard at most.")
@click.option("--max-size", default="256MB", show_default=True, callback=_size, help="Bytes per shard at most (e.g. 256MB, 1GiB).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Writer processes [default: all cores].")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Write shards as Ray tasks: on a new local cluster of --workers CPUs (no ADDRESS, or local), "
                   "or on the cluster at ADDRESS (auto, ray://host:port). Put it after SRC DST or write "
                   "--ray=ADDRESS. A local DST needs a one-node cluster.")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True, help="Shuffle samples across shards.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Seed of the shuffle.")
@click.option("--prefix", default="shard", show_default=True, help="Shard names: PREFIX-NNNNNN.tar.")
@click.option("--resize-max", type=click.IntRange(min=1), default=None, help="Re-encode images whose shorter side exceeds PX.")
@click.option("--quality", default=90, show_default=True, type=click.IntRange(1, 100), help="JPEG quality when re-encoding.")
@click.option("--jpeg-restart", type=click.IntRange(min=1), default=None, metavar="N",
              help="Store JPEGs losslessly re-encoded with a restart marker every N MCUs at most (1 loaded "
                   "fastest in our benchmarks): identical pixels, the loader decodes only the crop; costs pack "
                   "CPU. Off: source bytes.")
@click.option("--uniform-names", is_flag=True, help="Name every image member .jpg whatever its format, so HF datasets, "
              "webdataset to_tuple and DALI get every sample of a mixed jpg/png set (format version 2).")
@click.option("--dali-index", is_flag=True, help="Also write DALI index files (<shard>.dali.idx, wds2idx format).")
@click.option("--decode-check", is_flag=True, help="Fully decode every image to find corrupt data (slower).")
@click.option("--overwrite", is_flag=True, help="Replace what a previous pack left in DST.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
@storage_option_flag
def pack_command(src: str, dst: str, fmt: str, annotations: str | None, drop_empty: bool, max_count: int,
                 max_size: int, workers: int | None, ray_address: str | None, shuffle: bool, seed: int, prefix: str,
                 resize_max: int | None, quality: int, jpeg_restart: int | None, uniform_names: bool, dali_index: bool, decode_check: bool, overwrite: bool, quiet: bool,
                 storage_option: tuple[str, ...]) -> None:
    """Pack the ImageFolder tree SRC into WebDataset tar shards under DST (path or fsspec URL).

    With --annotations instances.json, SRC is a COCO images folder: one sample per image
    record, its annotation records kept exactly in the sample's json member.

    Re-running the same command after an interruption resumes it; the output is
    byte-identical for any --workers.
    """
    coco = fmt == "coco" or (fmt == "auto" and annotations is not None)
    if coco and annotations is None:
        raise click.UsageError("--format coco needs --annotations INSTANCES.json")
    if not coco and (annotations is not None or drop_empty):
        raise click.UsageError("--annotations and --drop-empty apply to --format coco only")
    if coco and resize_max is not None:
        raise click.UsageError("--resize-max is not supported for COCO (it would invalidate the boxes)")
    try:
        options = PackOptions(max_count=max_count, max_size=max_size, shuffle=shuffle, seed=seed,
                              prefix=prefix, resize_max=resize_max, quality=quality, decode_check=decode_check,
                              jpeg_restart=jpeg_restart, uniform_names=uniform_names, dali_index=dali_index)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    remote = storage_options(storage_option, dst)
    executor: Executor = "processes" if ray_address is None else "ray"
    address = None if ray_address in (None, "local") else ray_address
    bar = None
    if not quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(unit="img", desc="packing", dynamic_ncols=True)
    try:
        progress, procs = (bar.update if bar else None), workers or os.cpu_count()
        if annotations is not None:  # checked above: given exactly when packing COCO
            result = pack_coco(src, annotations, dst, drop_empty=drop_empty, options=options, workers=procs,
                               overwrite=overwrite, storage_options=remote, progress=progress,
                               executor=executor, ray_address=address)
        else:
            result = pack(src, dst, options=options, workers=procs, overwrite=overwrite,
                          storage_options=remote, progress=progress,
                          executor=executor, ray_address=address)
    finally:
        if bar:
            bar.close()
    if quiet:
        return
    m = result.manifest
    if result.already_complete:
        click.echo(f"{dst}: already packed with these inputs and options; nothing to do.")
    groups = f"{len(m.categories)} categories" if m.categories is not None else f"{len(m.classes or ())} classes"
    click.echo(f"samples   {m.num_samples:,}  ({groups})")
    click.echo(f"shards    {len(m.shards):,}  in {result.url}" + (f"  ({result.reused_shards} reused from an interrupted run)" if result.reused_shards and not result.already_complete else ""))
    click.echo(f"bytes     {human_bytes(m.num_bytes)}")
    click.echo(f"skipped   {len(m.skipped):,}")
    for s in m.skipped[:10]:
        click.echo(f"  - {s['source']}: {s['reason']}")
    if len(m.skipped) > 10:
        click.echo(f"  … {len(m.skipped) - 10} more in index.json")
    if not result.already_complete:
        click.echo(f"speed     {result.images_per_second:,.0f} images/s  ({result.seconds:.1f} s)")
