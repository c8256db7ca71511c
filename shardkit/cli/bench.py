"""``shardkit bench IMAGEFOLDER_DIR``: ShardLoader vs ImageFolder+DataLoader vs webdataset."""

from __future__ import annotations

from typing import Any

import click

from shardkit.cli.progress import BenchBar, bars_enabled


@click.command("bench")
@click.argument("imagefolder_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--shards", default=None,
              help="Packed dataset of IMAGEFOLDER_DIR (packed into it if it holds none) "
              "[default: pack into a temporary directory].")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=0),
              help="Loader workers (all loaders).")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--transform", default="train", show_default=True,
              type=click.Choice(["train", "val"]),
              help="train: RandomResizedCrop + flip; val: resize + centre crop (uint8 out).")
@click.option("--size", default=224, show_default=True, type=click.IntRange(min=1),
              help="Output side in pixels.")
@click.option("--epochs", default=2, show_default=True, type=click.IntRange(min=1),
              help="Epochs per timed run.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Runs per loader, alternating order.")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0),
              help="Untimed batches at the start of each run.")
@click.option("--drop-caches", is_flag=True,
              help="Drop the page cache before every run (needs root); default: warm cache.")
@click.option("--no-webdataset", is_flag=True, help="Leave out the plain webdataset baseline.")
@click.option("--jpeg-restart", type=click.IntRange(min=1), default=None, metavar="N",
              help="Pack with restart-indexed JPEGs (shardkit pack --jpeg-restart N); existing "
                   "--shards must have been packed with the same N.")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False),
              help="Write the JSON report here.")
@click.option("--plot", "plot", default=None, type=click.Path(dir_okay=False),
              help="Write a PNG bar chart here.")
@click.option("--quiet", "-q", is_flag=True,
              help="No progress bar or per-run lines; just the table.")
def bench_command(imagefolder_dir: str, shards: str | None, workers: int, batch_size: int,
                  device: str, transform: str, size: int, epochs: int, repeats: int, warmup: int,
                  drop_caches: bool, no_webdataset: bool, jpeg_restart: int | None, out: str | None,
                  plot: str | None, quiet: bool) -> None:
    """Measure images/s of ShardLoader against torchvision ImageFolder + DataLoader and plain
    webdataset on IMAGEFOLDER_DIR, side by side, with the same transform, batch size and workers.

    Packs the tree first unless --shards names a packed dataset (pack speed is reported
    separately). Prints a table; --out writes JSON, --plot a PNG.
    """
    from shardkit.bench import BenchConfig, format_table, plot_report, run_bench, write_json

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError("--device cuda: no CUDA device is available")
    contenders = tuple(c for c in ("imagefolder", "webdataset", "shardloader")
                       if not (no_webdataset and c == "webdataset"))
    cfg = BenchConfig(imagefolder=imagefolder_dir, shards=shards, workers=workers,
                      batch_size=batch_size, device=device, transform=transform, size=size,
                      epochs=epochs, repeats=repeats, warmup=warmup, drop_caches=drop_caches,
                      contenders=contenders, jpeg_restart=jpeg_restart)
    bar = BenchBar(bars_enabled(quiet))

    def after_run(name: str, rep: int, result: Any) -> None:
        if not bar.enabled and not quiet:
            click.echo(f"  {name:<12} run {rep + 1}/{repeats}: {result.images_per_second:,.0f} "
                       f"img/s ({result.images} images in {result.seconds:.1f} s)", err=True)

    try:
        report = run_bench(cfg, sink=bar, after_run=after_run)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    finally:
        bar.close()
    click.echo(format_table(report))
    if out:
        write_json(report, out)
        click.echo(f"report: {out}")
    if plot:
        plot_report(report, plot)
        click.echo(f"plot:   {plot}")
