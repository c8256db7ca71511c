"""``shardkit bench IMAGEFOLDER_DIR``: ShardLoader vs ImageFolder+DataLoader vs webdataset."""

from __future__ import annotations

from typing import Any

import click

from shardkit.cli.progress import BenchBar, bars_enabled


@click.command("bench")
@click.argument("imagefolder_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--annotations", type=click.Path(exists=True, dir_okay=False), default=None,
              help="COCO instances JSON: IMAGEFOLDER_DIR is then the images directory, and torchvision "
                   "CocoDetection is measured against ShardLoader with detection_train(--size, --max-size): "
                   "its COCO route, and with --device cuda its COCO GPU route too.")
@click.option("--max-size", default=1333, show_default=True, type=click.IntRange(min=1),
              help="--annotations: the longer side's limit after resizing.")
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
@click.option("--size", default=None, type=click.IntRange(min=1),
              help="Output side in pixels [default: 224; with --annotations: the shorter side, 800].")
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
              help="Pack with restart-indexed JPEGs (shardkit pack --jpeg-restart N); existing --shards must "
                   "have been packed with the same N.")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option("--plot", "plot", default=None, type=click.Path(dir_okay=False), help="Write a PNG bar chart here.")
@click.option("--train", "train_model", type=click.Choice(["resnet18", "resnet50"]), default=None,
              help="Measure the images/s of a compiled bf16 training step of this model fed by each loader, "
                   "and its share of the same step fed one fixed batch (needs --shards).")
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1),
              help="--train: timed steps per run (after --warmup untimed ones).")
@click.option("--contender", "contenders", multiple=True,
              type=click.Choice(["imagefolder", "shardloader", "shardloader_tc", "dali", "dali_files"]),
              help="--train: a loader to measure (repeatable) [default: imagefolder, shardloader, and dali when "
                   "NVIDIA DALI is installed]. shardloader_tc: TorchCodec's GPU decoder from 4 threads "
                   "(GpuOptions(decode_threads=4)); "
                   "dali: DALI's webdataset reader on --shards (with their .dali.idx files if present); "
                   "dali_files: DALI's file reader on IMAGEFOLDER_DIR.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or per-run lines; just the table.")
def bench_command(imagefolder_dir: str, annotations: str | None, max_size: int, shards: str | None, workers: int,
                  batch_size: int, device: str, transform: str, size: int | None, epochs: int, repeats: int,
                  warmup: int, drop_caches: bool, no_webdataset: bool, jpeg_restart: int | None, out: str | None,
                  plot: str | None, train_model: str | None, steps: int, contenders: tuple[str, ...],
                  quiet: bool) -> None:
    """Measure images/s of ShardLoader against torchvision ImageFolder + DataLoader and plain
    webdataset on IMAGEFOLDER_DIR, side by side, with the same transform, batch size and workers.

    Packs the tree first unless --shards names a packed dataset (pack speed is reported
    separately). Prints a table; --out writes JSON, --plot a PNG.

    With --train MODEL: the loaders feed a training step instead (see shardkit.bench.train).
    With --annotations: a COCO source, torchvision CocoDetection against ShardLoader's COCO route
    (and its COCO GPU route with --device cuda).
    """
    size = size or (800 if annotations is not None else 224)
    if annotations is not None and train_model is not None:
        raise click.UsageError("--train measures classification only; leave out --annotations or --train")
    from shardkit.bench import BenchConfig, format_table, plot_report, run_bench, write_json

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError("--device cuda: no CUDA device is available")
    if train_model is not None:
        _train(imagefolder_dir, shards, train_model, workers=workers, batch_size=batch_size, device=device,
               size=size, steps=steps, warmup=warmup, repeats=repeats, out=out, quiet=quiet,
               contenders=contenders)
        return
    if contenders:
        raise click.UsageError("--contender chooses --train loaders; without --train use --no-webdataset")
    contenders = tuple(c for c in ("imagefolder", "webdataset", "shardloader")
                       if not (no_webdataset and c == "webdataset"))
    cfg = BenchConfig(imagefolder=imagefolder_dir, shards=shards, workers=workers, batch_size=batch_size,
                      device=device, transform=transform, size=size, epochs=epochs, repeats=repeats,
                      warmup=warmup, drop_caches=drop_caches, contenders=contenders,
                      jpeg_restart=jpeg_restart, annotations=annotations, max_size=max_size)
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


def _train(imagefolder_dir: str, shards: str | None, model: str, *, workers: int, batch_size: int, device: str,
           size: int, steps: int, warmup: int, repeats: int, out: str | None, quiet: bool,
           contenders: tuple[str, ...]) -> None:
    from shardkit.bench import write_json
    from shardkit.bench.dali import dali_available
    from shardkit.bench.train import TrainBenchConfig, TrainRun, format_train_table, run_train_bench
    from shardkit.index.manifest import locate_dataset

    if shards is None or not locate_dataset(shards).exists("index.json"):
        raise click.UsageError("--train needs --shards naming a packed dataset of IMAGEFOLDER_DIR "
                               "(shardkit pack IMAGEFOLDER_DIR SHARDS)")
    if not contenders:
        contenders = ("imagefolder", "shardloader", *(("dali",) if dali_available() else ()))
    cfg = TrainBenchConfig(imagefolder=imagefolder_dir, shards=shards, model=model, size=size,
                           batch_size=batch_size, workers=workers, steps=steps, warmup=warmup, repeats=repeats,
                           device=device, compile=device == "cuda", contenders=tuple(dict.fromkeys(contenders)))

    def after_run(name: str, rep: int, run: TrainRun) -> None:
        if not quiet:
            click.echo(f"  {name:<12} run {rep + 1}/{repeats}: fed {run.fed_images_per_second:,.0f} img/s, "
                       f"synthetic {run.synthetic_images_per_second:,.0f} img/s, share {run.share:.0%}", err=True)

    try:
        report = run_train_bench(cfg, after_run=after_run)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    click.echo(format_train_table(report))
    if out:
        write_json(report, out)
        click.echo(f"report: {out}")
