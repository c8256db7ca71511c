"""``shardkit bench SRC``: ShardLoader vs ImageFolder+DataLoader vs webdataset."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from shardkit.cli.bench_args import (
    CLASSIFIER_SHARDS,
    DETECTOR_SHARDS,
    PIXELS,
    BenchError,
    check_source,
    dali_threads_option,
    feeders_option,
    needs_shards,
    png_path,
    refuse_other_modes_options,
    writable,
)
from shardkit.cli.bench_output import is_stdout, report_stopped, save, save_before_stopping, terminal_width
from shardkit.cli.location import FILE, FILE_OR_URL, FOLDER, LOCATION
from shardkit.cli.progress import BenchBar, bars_enabled
from shardkit.cli.report import fit
from shardkit.cli.storage import storage_option_flag, storage_options
from shardkit.cli.workers import WORKERS
from shardkit.storage import is_remote, within

if TYPE_CHECKING:
    from shardkit.bench.train import TrainRun

# Spelled out, not imported: `shardkit --help` must not import torch (tests check they match the library's).
CLASSIFIERS = ("resnet18", "resnet50")
DETECTORS = ("fasterrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn_v2", "fasterrcnn_mobilenet_v3_large_fpn",
             "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn")
CLASSIFIER_CONTENDERS = ("imagefolder", "shardloader", "shardloader_inproc", "shardloader_feeders", "shardloader_tc",
                         "shardloader_cpu", "dali", "dali_files")
DETECTOR_CONTENDERS = ("cocodetection", "shardloader", "shardloader_cpu")
CONTENDERS = tuple(dict.fromkeys(CLASSIFIER_CONTENDERS + DETECTOR_CONTENDERS))


@click.command("bench")
@click.argument("src", type=FOLDER)
@click.option("--annotations", default=None, type=FILE_OR_URL,
              help="COCO instances JSON: SRC is then the images directory, and torchvision "
                   "CocoDetection is measured against ShardLoader with detection_train(--size, --max-size): "
                   "its COCO route, and with --device cuda its COCO GPU route too. With --train DETECTOR: they "
                   "feed a detection training step.")
@click.option("--max-size", default=1333, show_default=True, type=PIXELS,
              help="--annotations: the longer side's limit after resizing, in pixels.")
@click.option("--captions", is_flag=True,
              help="SRC is a captioned source (a folder of images with .txt sidecars, a caption table "
                   "or a saved HF dataset): plain webdataset (decode('pil').to_tuple('jpg', 'txt')) against "
                   "ShardLoader, the same crop, each batch's captions tokenized in the workers.")
@click.option("--context-length", default=77, show_default=True, type=click.IntRange(min=1),
              help="--captions: tokens per caption (UTF-8 bytes).")
@click.option("--shards", default=None, type=LOCATION,
              help="Packed dataset of SRC (packed into it if it holds none) "
              "[default: pack into a temporary directory].")
@click.option("--workers", default="2", show_default=True, type=WORKERS,
              help="Loader workers (all loaders); auto: what ShardLoader's num_workers='auto' picks here.")
@click.option("--batch-size", default=None, type=click.IntRange(min=1),
              help="Images per batch [default: 64; with --train DETECTOR: 16].")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--transform", default="train", show_default=True,
              type=click.Choice(["train", "val"]),
              help="train: RandomResizedCrop + flip; val: resize + centre crop (uint8 out).")
@click.option("--size", default=None, type=click.IntRange(min=1),
              help="Output side in pixels [default: 224; with --annotations: the shorter side, 800].")
@click.option("--epochs", default=None, type=click.IntRange(min=1),
              help="Epochs per timed run [default: 2, more on a small data set: enough to time at least three "
                   "times the batches the workers prepare ahead, and at least 5 batches].")
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
@click.option("--out", "out", default=None, type=FILE, help="Write the JSON report here.")
@click.option("--plot", "plot", default=None, type=FILE, help="Write a PNG bar chart here.")
@click.option("--train", "train_model", type=click.Choice([*CLASSIFIERS, *DETECTORS]), default=None,
              metavar="MODEL",
              help="Measure the images/s of a bf16 training step of this model (compiled on cuda) fed by each loader, "
                   "and its share of the same step fed batches already on the device (needs --shards). A "
                   f"classifier ({', '.join(CLASSIFIERS)}) on an ImageFolder tree, or an untrained torchvision "
                   f"detector ({', '.join(DETECTORS)}) on a COCO source (with --annotations; --shards: its pack "
                   "made with --drop-empty).")
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1),
              help="--train: timed steps per run (after --warmup untimed ones).")
@click.option("--contender", "contenders", multiple=True, type=click.Choice(CONTENDERS),
              help="--train: a loader to measure (repeatable). Classifier [default: imagefolder, shardloader, and "
                   "dali when NVIDIA DALI is installed]: shardloader_inproc: the GPU route in the "
                   "training process (feeders=0); shardloader_feeders: the number of feeders that feeders='auto' "
                   "starts on cuda (1 to 4, one per 5 workers), kept whatever the loop's pace (auto times the "
                   "loop both ways and keeps the faster); "
                   "shardloader_tc: TorchCodec's GPU decoder from 4 threads "
                   "(GpuOptions(decode_threads=4)); shardloader_cpu: the CPU route (decode and crop in the "
                   "workers, uint8 batches copied to the device, normalised in the step); "
                   "dali: DALI's webdataset reader on --shards (with their .dali.idx files if present); "
                   "dali_files: DALI's file reader on SRC. Detector [default: cocodetection, "
                   "shardloader, and on cuda shardloader_cpu]: shardloader on --device (on cuda the COCO GPU "
                   "route), shardloader_cpu: ShardLoader on the CPU, its batches copied to the device.")
@click.option("--feeders", default="auto", show_default=True, metavar="auto|N",
              help="--train with a classifier: the feeder processes of the shardloader and shardloader_tc "
                   "contenders (ShardLoader's feeders; auto: one per 5 workers, 1 to 4, on cuda, none on cpu; "
                   "N: that many, on either).")
@click.option("--dali-threads", default=None, metavar="N[,N...]",
              help="--train with a classifier: DALI's num_threads, one row per value (e.g. 8,12,16: DALI's best "
                   "count differs by machine and model) [default: --workers].")
@click.option("--dali-hw-load", type=click.FloatRange(0, 1), default=None,
              help="--train: DALI's hw_decoder_load, the share of JPEGs on the hardware decoder [default: DALI's].")
@click.option("--dali-prefetch", type=click.IntRange(min=1), default=2, show_default=True,
              help="--train: DALI's prefetch_queue_depth, the batches it prepares ahead.")
@click.option("--isolate/--no-isolate", default=True, show_default=True,
              help="--train with a classifier: each run in a process of its own, nothing of another contender "
                   "alive beside it (as in a training job).")
@click.option("--sleep-waits", is_flag=True,
              help="--train with a classifier on cuda: every run's waits on the device block instead of spinning a "
                   "core (the step's, ShardLoader's and DALI's alike), as ShardLoader's feeders always do.")
@storage_option_flag
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or per-run lines; just the table.")
def bench_command(src: str, annotations: str | None, max_size: int, captions: bool, context_length: int,
                  shards: str | None, workers: int,
                  batch_size: int | None, device: str, transform: str, size: int | None, epochs: int | None,
                  repeats: int,
                  warmup: int, drop_caches: bool, no_webdataset: bool, jpeg_restart: int | None, out: str | None,
                  plot: str | None, train_model: str | None, steps: int, contenders: tuple[str, ...],
                  feeders: str, dali_threads: str | None, dali_hw_load: float | None, dali_prefetch: int,
                  isolate: bool, sleep_waits: bool, storage_option: tuple[str, ...], quiet: bool) -> None:
    """Measure images/s of ShardLoader against torchvision ImageFolder + DataLoader and plain
    webdataset on SRC, side by side, with the same transform, batch size and workers.

    Packs the tree first unless --shards names a packed dataset (pack speed is reported
    separately). Prints a table; --out writes JSON, --plot a PNG.

    With --train MODEL: the loaders feed a training step instead (see shardkit.bench.train).
    With --captions: a captioned source, plain webdataset against ShardLoader on its captioned
    shards, both tokenizing each batch's captions in their workers.
    With --annotations: a COCO source, torchvision CocoDetection against ShardLoader's COCO route
    (and its COCO GPU route with --device cuda); with --annotations and --train DETECTOR, the
    loaders feed a detection training step (see shardkit.bench.train_detection).
    """
    if captions and (annotations is not None or train_model is not None):
        raise click.UsageError("--captions times the loaders alone: leave out --annotations and --train")
    given = click.get_current_context().get_parameter_source
    if annotations is None and given("max_size") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--max-size applies with --annotations (a COCO bench's longer-side limit)")
    if not captions and given("context_length") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--context-length applies with --captions (tokens per caption)")
    check_source(src, annotations, captions=captions)
    size = size or (800 if annotations is not None else 224)
    detector = train_model in DETECTORS
    batch_size = batch_size or (16 if detector else 64)
    if train_model in CLASSIFIERS and annotations is not None:
        raise click.UsageError(f"--train {train_model} is a classifier, for an ImageFolder tree: leave out "
                               f"--annotations, or train a detector (--train {DETECTORS[0]}, ...)")
    if detector and annotations is None:
        raise click.UsageError(f"--train {train_model} is a detector: it needs --annotations, the COCO instances "
                               "JSON (SRC is then its images directory)")
    if sleep_waits and (train_model is None or detector or not device.startswith("cuda")):
        raise click.UsageError("--sleep-waits is for --train with a classifier on --device cuda")
    feeder_count = feeders_option(feeders, workers, train_model is not None and not detector, contenders)
    refuse_other_modes_options(click.get_current_context(), train=train_model is not None, detector=detector)
    dali_counts = dali_threads_option(dali_threads)
    fitting = DETECTOR_CONTENDERS if detector else CLASSIFIER_CONTENDERS
    if train_model is not None and not set(contenders) <= set(fitting):
        wrong = ", ".join(c for c in contenders if c not in fitting)
        raise click.UsageError(f"--contender {wrong} does not feed --train {train_model}; its loaders: "
                               f"{', '.join(fitting)}")
    for option, path in (("--out", out), ("--plot", plot)):
        if path is not None and shards is not None and within(path, shards):
            raise click.UsageError(f"{option} {path} is inside --shards {shards}: the report would be written among "
                                   "the pack's files (over them, where it has their names); write it elsewhere")
    if out is not None:
        out = writable(out, "--out")
    if plot is not None:
        plot = writable(png_path(writable(plot, "--plot"), out), "--plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise BenchError("--plot needs matplotlib: pip install 'shardkit[bench]' (or leave out --plot)")
    if storage_option and (shards is None or not is_remote(shards)):
        raise click.UsageError("--storage-option (-o) applies to a --shards URL (s3://..., gs://...)")
    if train_model is not None:
        shards = needs_shards(shards, DETECTOR_SHARDS if detector else CLASSIFIER_SHARDS)
    elif contenders:
        raise click.UsageError("--contender chooses --train loaders; without --train use --no-webdataset")
    if not quiet:  # the cheap checks passed; torch and the data take seconds: say what is happening now
        click.echo(f"bench: {src}: loading torch and reading the data…", err=True)
    from shardkit.bench import BenchConfig, format_table, plot_report, run_bench

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError("--device cuda: no CUDA device is available")
    if train_model is not None:
        assert shards is not None  # needs_shards above
        if annotations is not None:  # a detector (a classifier was refused above)
            _train_detector(src, annotations, shards, train_model, workers=workers,
                            batch_size=batch_size, device=device, size=size, max_size=max_size, steps=steps,
                            warmup=warmup, repeats=repeats, out=out, quiet=quiet, contenders=contenders)
            return
        _train(src, shards, train_model, workers=workers, batch_size=batch_size, device=device,
               size=size, steps=steps, warmup=warmup, repeats=repeats, out=out, quiet=quiet,
               contenders=contenders, feeders=feeder_count, dali_threads=dali_counts, dali_hw_load=dali_hw_load,
               dali_prefetch=dali_prefetch, isolate=isolate, sleep_waits=sleep_waits)
        return
    if captions and no_webdataset:
        raise click.UsageError("--captions measures ShardLoader against webdataset: leave out --no-webdataset")
    contenders = (("webdataset", "shardloader") if captions
                  else tuple(c for c in ("imagefolder", "webdataset", "shardloader")
                             if not (no_webdataset and c == "webdataset")))
    cfg = BenchConfig(imagefolder=src, shards=shards, workers=workers, batch_size=batch_size,
                      device=device, transform=transform, size=size, epochs=epochs, repeats=repeats,
                      warmup=warmup, drop_caches=drop_caches, contenders=contenders,
                      jpeg_restart=jpeg_restart, annotations=annotations, max_size=max_size, captions=captions,
                      context_length=context_length,
                      storage_options=storage_options(storage_option, shards) if shards is not None else None)
    bar = BenchBar(bars_enabled(quiet))
    name_width = max(len(c) for c in (*contenders, "shardloader-gpu"))

    def after_run(name: str, rep: int, result: Any) -> None:
        if not bar.enabled and not quiet:
            click.echo(f"  {name:<{name_width}} run {rep + 1}/{repeats}: {result.images_per_second:,.0f} "
                       f"img/s ({result.images} images in {result.seconds:.1f} s)", err=True)

    def note(text: str) -> None:
        bar.close()  # the note on its own line, not under a bar being drawn
        click.echo(fit(f"note: {text}", 2), err=True)

    from shardkit.bench.finished import Interrupted

    try:
        report = run_bench(cfg, sink=bar, after_run=after_run, note=note)
    except ValueError as err:
        raise BenchError(str(err)) from err
    except Interrupted as stopped:  # the runs finished are measurements: shown and saved, then the exit of ^C
        bar.close()
        report_stopped(stopped, lambda r, width: format_table(r, width=width), out, plot, plot_report)
    finally:
        bar.close()
    click.echo(format_table(report, width=terminal_width()), err=is_stdout(out))
    save(report, out, plot, plot_report)


def _measure_train(run: Callable[[Callable[[str, int, TrainRun], None]], dict[str, Any]],
                   table: Callable[[dict[str, Any], int | None], str], *, repeats: int, out: str | None,
                   quiet: bool) -> None:
    """``run(after_run)`` (a training bench), one line per run unless ``quiet``; then the table.
    Stopped part-way (Ctrl-C, SIGTERM), the table and ``out`` of the runs it finished, then the
    exit of any interrupted command (130, 143 for SIGTERM)."""
    from shardkit.bench.train_report import rate

    width = max(map(len, CONTENDERS))

    def after_run(name: str, rep: int, result: TrainRun) -> None:
        if not quiet:
            click.echo(f"  {name:<{width}} run {rep + 1}/{repeats}: fed {rate(result.fed_images_per_second)} img/s, "
                       f"synthetic {rate(result.synthetic_images_per_second)} img/s, share {share(result.share)}",
                       err=True)

    from shardkit.bench.finished import Interrupted
    from shardkit.bench.isolate import RunLost

    try:
        report = run(after_run)
    except RunLost as lost:  # the bench ends; what it measured before is kept
        if lost.report is not None:
            click.echo(table(lost.report, terminal_width()), err=is_stdout(out))
            save_before_stopping(lost.report, out)
        raise BenchError(str(lost)) from lost
    except ValueError as err:
        raise BenchError(str(err)) from err
    except Interrupted as stopped:
        report_stopped(stopped, table, out)
    click.echo(table(report, terminal_width()), err=is_stdout(out))
    save(report, out, None)


def share(value: float) -> str:
    """A run's share (fed over synthetic images/s). Over 100% the fed run outpaced the step fed
    nothing, so the figure measures noise or contention between the two runs, not the loader:
    it is not printed as a percentage.

    Example:
        >>> share(0.873), share(1.68)
        ('87%', '— (fed outran synthetic: noise)')
    """
    return f"{value:.0%}" if value <= 1 else "— (fed outran synthetic: noise)"  # the table's ">100%"


def _train(src: str, shards: str, model: str, *, workers: int, batch_size: int, device: str,
           size: int, steps: int, warmup: int, repeats: int, out: str | None, quiet: bool,
           contenders: tuple[str, ...], feeders: int | str, dali_threads: tuple[int, ...] = (),
           dali_hw_load: float | None = None, dali_prefetch: int = 2, isolate: bool = True,
           sleep_waits: bool = False) -> None:
    from shardkit.bench.dali import dali_available
    from shardkit.bench.train import TrainBenchConfig, format_train_table, run_train_bench

    if not contenders:
        contenders = ("imagefolder", "shardloader", *(("dali",) if dali_available() else ()))
    cfg = TrainBenchConfig(imagefolder=src, shards=shards, model=model, size=size,
                           batch_size=batch_size, workers=workers, steps=steps, warmup=warmup, repeats=repeats,
                           device=device, compile=device == "cuda", contenders=tuple(dict.fromkeys(contenders)),
                           feeders=feeders, dali_threads=dali_threads, dali_hw_decoder_load=dali_hw_load,
                           dali_prefetch=dali_prefetch, isolate=isolate, sleep_waits=sleep_waits)
    _say_too_many_workers(workers)
    _measure_train(lambda after_run: run_train_bench(cfg, after_run=after_run), format_train_table,
                   repeats=repeats, out=out, quiet=quiet)


def _say_too_many_workers(workers: int) -> None:
    """The one note a training bench gives of more workers than cores (its loaders' own warnings,
    one a run, are left out)."""
    from shardkit.bench.checks import too_many_workers

    if (crowded := too_many_workers(workers)) is not None:
        click.echo(fit(f"note: {crowded}", 2), err=True)


def _train_detector(images: str, annotations: str, shards: str, model: str, *, workers: int,
                    batch_size: int, device: str, size: int, max_size: int, steps: int, warmup: int, repeats: int,
                    out: str | None, quiet: bool, contenders: tuple[str, ...]) -> None:
    from shardkit.bench.train_detection import DetectionBenchConfig, format_detection_table, run_detection_train_bench

    if not contenders:
        contenders = ("cocodetection", "shardloader", *(("shardloader_cpu",) if device == "cuda" else ()))
    cfg = DetectionBenchConfig(images=images, annotations=annotations, shards=shards, model=model, size=size,
                               max_size=max_size, batch_size=batch_size, workers=workers, steps=steps, warmup=warmup,
                               repeats=repeats, device=device,  # eager: see shardkit.bench.train_detection
                               contenders=tuple(dict.fromkeys(contenders)))
    _say_too_many_workers(workers)
    _measure_train(lambda after_run: run_detection_train_bench(cfg, after_run=after_run), format_detection_table,
                   repeats=repeats, out=out, quiet=quiet)
