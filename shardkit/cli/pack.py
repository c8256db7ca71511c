"""``shardkit pack SRC DST``."""

from __future__ import annotations

import logging
import os

import click

from shardkit.cli.location import FILE_OR_URL, LOCATION
from shardkit.cli.progress import PackBar, bars_enabled
from shardkit.cli.report import human_bytes, print_pack_summary, print_skipped
from shardkit.cli.storage import storage_option_flag, storage_options
from shardkit.cli.workers import WRITERS
from shardkit.codec import jpeg_restart as jpeg_restart_codec
from shardkit.errors import StorageError
from shardkit.format.spec import IMAGE_EXTENSIONS
from shardkit.pack import (
    Executor,
    PackOptions,
    PackResult,
    SkipBudget,
    SkipBudgetError,
    pack,
    pack_captions,
    pack_coco,
    parse_size,
)
from shardkit.sources.hf import hf_is_labelled, is_hf_dataset
from shardkit.sources.table import is_table
from shardkit.storage import is_remote

IMAGE_SUFFIXES = tuple("." + e for e in IMAGE_EXTENSIONS)


def _refuse_options_without_effect(src: str, dst: str, annotations: str | None, images_root: str | None,
                                   captions: bool, resize_max: int | None, quality: int, shuffle: bool, seed: int,
                                   storage_option: tuple[str, ...], source_option: tuple[str, ...]) -> None:
    """An option value that this pack would not use is an error, not a silent no-op: a pack
    records its options, so one that did nothing would still refuse a later re-run without it."""
    if resize_max is None and quality != 90:
        raise click.UsageError("--quality applies with --resize-max only (the quality of the images it "
                               "re-encodes); other images are packed as they are")
    if not shuffle and seed != 0:
        raise click.UsageError("--seed applies with --shuffle only (it seeds the shuffle); --no-shuffle "
                               "packs in the source's order")
    # a caption table may list image URLs, whatever the table's own location
    urls_inside = captions and is_table(src)
    sources = [u for u in (src, annotations, images_root) if u is not None]
    if source_option and not urls_inside and not any(is_remote(u) for u in sources):
        raise click.UsageError(f"--source-option applies to a URL SRC (or --annotations URL); {src} is a local path")
    if storage_option and not urls_inside and not any(is_remote(u) for u in (*sources, dst)):
        raise click.UsageError(f"--storage-option applies to URLs; {src} and {dst} are local paths")


def _size(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err


def _budget(_ctx: click.Context, _param: click.Parameter, value: str | None) -> SkipBudget | None:
    try:
        return None if value is None else SkipBudget.parse(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err


@click.command("pack")
@click.argument("src", type=LOCATION)
@click.argument("dst", type=LOCATION)
@click.option("--format", "fmt", type=click.Choice(["auto", "imagefolder", "coco", "captions"]), default="auto",
              show_default=True,
              help="Input layout; auto: coco when --annotations is given, captions when SRC is a table "
                   "(.csv, .tsv, .jsonl, .parquet) or a caption option is given, else imagefolder; a saved HF "
                   "dataset is imagefolder when it has a ClassLabel column and no caption column, else captions. "
                   "captions: a folder of images with .txt (and .json) sidecars, or a table of image paths/URLs "
                   "and captions.")
@click.option("--annotations", default=None, type=FILE_OR_URL,
              help="COCO instances JSON, a path or URL (SRC is then the images folder).")
@click.option("--drop-empty", is_flag=True, help="COCO: leave out images without annotations.")
@click.option("--allow-empty", is_flag=True,
              help="ImageFolder: keep class folders without images as classes of no sample, as "
                   "ImageFolder(allow_empty=True) (a subset of a dataset's classes then mixes with it as is).")
@click.option("--image-column", default=None, metavar="NAME",
              help="Caption table: the column of image paths or URLs [default: image, url, path or file_name]; "
                   "saved HF dataset: its Image column [default: the only one].")
@click.option("--label-column", default=None, metavar="NAME",
              help="Saved HF dataset of labelled images: its ClassLabel column [default: the only one].")
@click.option("--caption-column", default=None, metavar="NAME",
              help="Caption table: the caption column [default: caption, text or txt].")
@click.option("--extra-columns", default=None, metavar="A,B,...",
              help="Caption table: columns kept in each sample's json (empty: none) [default: all others].")
@click.option("--images-root", default=None, metavar="DIR|URL", type=LOCATION,
              help="Caption table: where relative image paths start [default: the table's folder].")
@click.option("--split", default=None, metavar="NAME",
              help="A HF DatasetDict saved with save_to_disk: the split to pack.")
@click.option("--max-count", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Samples per shard at most.")
@click.option("--max-size", default="256MB", show_default=True, callback=_size,
              help="Bytes per shard at most (e.g. 256MB, 1GiB).")
@click.option("--workers", type=WRITERS, default="auto", show_default=True,
              help="Writer processes; auto: the cores this process may use.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]",
              help="Write shards as Ray tasks: on a new local cluster of --workers CPUs (no "
                   "ADDRESS, or local), or on the cluster at ADDRESS (auto, host:port; ray://host:port needs "
                   "ray[client]). Put "
                   "it after SRC DST or write --ray=ADDRESS. A local DST needs a one-node cluster.")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True,
              help="Shuffle samples across shards.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the shuffle.")
@click.option("--prefix", default="shard", show_default=True,
              help="Shard names: PREFIX-NNNNNN.tar.")
@click.option("--resize-max", type=click.IntRange(min=1), default=None,
              help="Re-encode images whose shorter side exceeds PX.")
@click.option("--quality", default=90, show_default=True, type=click.IntRange(1, 100),
              help="JPEG quality when re-encoding.")
@click.option("--jpeg-restart", type=click.IntRange(min=1), default=None, metavar="N",
              help="Store JPEGs losslessly re-encoded with a restart marker every N MCUs at most "
                   "(1 loaded fastest in our benchmarks): identical pixels, the loader decodes "
                   "only the crop; costs pack CPU. Off: source bytes.")
@click.option("--uniform-names", is_flag=True,
              help="Name every image member .jpg whatever its format, so HF datasets, "
              "webdataset to_tuple and DALI get every sample of a mixed jpg/png set (format "
              "version 2).")
@click.option("--dali-index", is_flag=True,
              help="Also write DALI index files (<shard>.dali.idx, wds2idx format).")
@click.option("--decode-check", is_flag=True,
              help="Decode JPEGs in full too (slower): then every packed image is one the loader "
                   "decodes; by default a JPEG with its end marker is packed undecoded.")
@click.option("--overwrite", is_flag=True, help="Replace what a previous pack left in DST.")
@click.option("--max-skipped", default=None, callback=_budget, metavar="N|P%",
              help="Fail, without publishing index.json, when more inputs than N (or P% of them) "
                   "are skipped as unreadable or corrupt [default: any number, but a pack of no "
                   "sample fails].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, summary or warnings; errors only.")
@storage_option_flag
@click.option("--source-option", "source_option", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for a URL SRC (and --annotations), repeatable, as -o; when "
                   "given, SRC uses these instead of the -o options (e.g. anon=true for a public "
                   "bucket).")
def pack_command(src: str, dst: str, fmt: str, annotations: str | None, drop_empty: bool, allow_empty: bool,
                 image_column: str | None, label_column: str | None, caption_column: str | None,
                 extra_columns: str | None,
                 images_root: str | None, split: str | None, max_count: int, max_size: int,
                 workers: int, ray_address: str | None,
                 shuffle: bool, seed: int, prefix: str, resize_max: int | None, quality: int,
                 jpeg_restart: int | None, uniform_names: bool, dali_index: bool,
                 decode_check: bool, overwrite: bool, max_skipped: SkipBudget | None, quiet: bool,
                 storage_option: tuple[str, ...], source_option: tuple[str, ...]) -> None:
    """Pack SRC (an ImageFolder tree, a COCO images folder, captioned images) into WebDataset tar
    shards under DST. Each may be a path or an fsspec URL (s3://bucket/train); a tree gives the
    same output from disk or a bucket.

    With --annotations instances.json, SRC is a COCO images folder: one sample per image
    record, its annotation records kept exactly in the sample's json member.

    With --format captions (implied by a table SRC), SRC is a folder of images with .txt caption
    sidecars, a .csv/.tsv/.jsonl/.parquet table of image paths or URLs and captions, or a HF
    image-text dataset saved with save_to_disk: one sample per image, as img2dataset writes them
    (jpg/png, txt, json). A saved HF dataset of images with a ClassLabel column (no caption column)
    is packed as labelled images, the ClassLabel's names its classes (--split names a
    DatasetDict's split).

    Re-running the same command after an interruption resumes it; the output is
    byte-identical for any --workers.
    """
    table_options = {"--image-column": image_column, "--caption-column": caption_column,
                     "--extra-columns": extra_columns, "--images-root": images_root, "--split": split}
    given = [name for name, value in table_options.items() if value is not None]
    hf = not is_remote(src) and not is_table(src) and is_hf_dataset(src)
    caption_options = caption_column is not None or extra_columns is not None or images_root is not None
    labelled_hf = hf and annotations is None and (fmt == "imagefolder" or (fmt == "auto" and not caption_options and (
        label_column is not None or hf_is_labelled(src, split))))
    hf_options = ("--split", "--image-column")
    if labelled_hf and [name for name in given if name not in hf_options]:
        raise click.UsageError(f"{', '.join(n for n in given if n not in hf_options)}: for a caption table or a saved "
                               f"HF dataset of image-text pairs (--format captions); {src} is packed as labelled "
                               "images (--format imagefolder), where --split, --image-column and --label-column apply")
    if label_column is not None and not labelled_hf:
        raise click.UsageError(f"--label-column: for a saved HF dataset of labelled images, not {src}")
    captions = fmt == "captions" or (fmt == "auto" and annotations is None and not labelled_hf
                                     and (is_table(src) or hf or bool(given)))
    if captions and annotations is not None:
        raise click.UsageError("--annotations applies to --format coco only")
    if given and not labelled_hf and not (captions and (is_table(src) or hf)):
        raise click.UsageError(f"{', '.join(given)}: for a caption table (SRC ending in .csv, .tsv, .jsonl, "
                               f".parquet) or a saved HF dataset, not {src}")
    coco = fmt == "coco" or (fmt == "auto" and annotations is not None)
    if coco and annotations is None:
        raise click.UsageError("--format coco needs --annotations INSTANCES.json")
    if not coco and (annotations is not None or drop_empty):
        named = " and ".join(n for n, v in (("--annotations", annotations is not None), ("--drop-empty", drop_empty))
                             if v)
        raise click.UsageError(f"{named} {'apply' if ' and ' in named else 'applies'} to --format coco only")
    if allow_empty and (coco or captions or labelled_hf):
        which = "a saved HF dataset" if labelled_hf else f"--format {'coco' if coco else 'captions'}"
        raise click.UsageError(f"--allow-empty applies to an ImageFolder tree, not to {which}")
    if coco and resize_max is not None:
        raise click.UsageError("--resize-max is not supported for COCO (it would invalidate the "
                               "boxes)")
    _refuse_options_without_effect(src, dst, annotations, images_root, captions, resize_max, quality, shuffle, seed,
                                   storage_option, source_option)
    if jpeg_restart is not None and not jpeg_restart_codec.available():  # an install's fault, not the command's
        raise click.ClickException("--jpeg-restart needs shardkit's C extension shardkit.codec._jpeg_restart, "
                                   "which is not built here (install the libjpeg headers, then reinstall shardkit)")
    try:
        options = PackOptions(max_count=max_count, max_size=max_size, shuffle=shuffle, seed=seed,
                              prefix=prefix, resize_max=resize_max, quality=quality,
                              decode_check=decode_check, jpeg_restart=jpeg_restart,
                              uniform_names=uniform_names, dali_index=dali_index)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    remote = storage_options(storage_option, dst)
    src_url = next((u for u in (src, annotations) if u is not None and is_remote(u)), src)
    from_src = storage_options(source_option or storage_option, src_url)
    executor: Executor = "processes" if ray_address is None else "ray"
    address = None if ray_address in (None, "local") else ray_address
    bar = PackBar(bars_enabled(quiet))
    bar.listing(src)
    warnings = _Warnings()
    pack_log = logging.getLogger("shardkit.pack")
    pack_log.addHandler(warnings)
    try:
        if captions:
            columns = None if extra_columns is None else [c.strip() for c in extra_columns.split(",") if c.strip()]
            try:
                result = pack_captions(src, dst, image_column=image_column, caption_column=caption_column,
                                       extra_columns=columns, images_root=images_root, split=split, options=options,
                                       workers=workers, overwrite=overwrite, storage_options=remote,
                                       source_options=from_src, progress=bar, executor=executor,
                                       ray_address=address, max_skipped=max_skipped)
            except ValueError as err:  # an option that does not fit this SRC
                raise click.UsageError(str(err)) from err
        elif annotations is not None:  # checked above: given exactly when packing COCO
            result = pack_coco(src, annotations, dst, drop_empty=drop_empty, options=options,
                               workers=workers, overwrite=overwrite, storage_options=remote,
                               source_options=from_src, progress=bar, executor=executor,
                               ray_address=address, max_skipped=max_skipped)
        else:
            result = pack(src, dst, options=options, workers=workers, overwrite=overwrite,
                          storage_options=remote, source_options=from_src, progress=bar,
                          executor=executor, ray_address=address, max_skipped=max_skipped,
                          allow_empty=allow_empty, **({"split": split, "image_column": image_column,
                                                       "label_column": label_column} if labelled_hf else {}))
    except SkipBudgetError as err:
        bar.close()
        if not quiet:
            print_skipped(err.skipped, err=True)
        raise
    except StorageError as err:
        if source_option and _O_HINT in err.message and err.where and not _under(err.where, dst):
            # the source (SRC, the annotations, a table's image URLs) read --source-option's options, not -o's
            raise StorageError(err.message.replace(_O_HINT, "--source-option client_kwargs.endpoint_url=…"),
                               where=err.where) from err.__cause__
        raise
    finally:
        pack_log.removeHandler(warnings)
        bar.close()
    if not quiet:  # -q: errors only
        for message in warnings.messages:
            click.echo(message, err=True)
        print_pack_summary(result, dst)
        _note_one_sample_shards(result, options)
        if annotations is None and not captions:
            _note_loose_images(src)


#: How an unreachable S3 endpoint's message says to set it in a command (shardkit.storage).
_O_HINT = "-o client_kwargs.endpoint_url=…"


def _under(where: str, url: str) -> bool:
    """Whether ``where`` is ``url`` or inside it (at a ``/``).

    >>> _under("s3://b/train-raw/x.jpg", "s3://b/train-raw/"), _under("s3://b/train-raw", "s3://b/train")
    (True, False)
    """
    return where == url.rstrip("/") or where.startswith(url.rstrip("/") + "/")


class _Warnings(logging.Handler):
    """The pack's warnings (a mixed-format set, ...), kept to be printed above the summary of a pack
    that succeeded, each on a line of its own: printed as they come, one would run on after the
    ``listing SRC …`` status, or stand above an error that ends the pack (a Ray cluster of several
    nodes found with a local source) as a second line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _note_one_sample_shards(result: PackResult, options: PackOptions) -> None:
    """Say so when --max-size left one sample in every shard (it is below the samples' size): a
    dataset of many tiny files, which is what shards are for avoiding."""
    m = result.manifest
    # one sample each, and either nothing skipped (each shard was cut for one input) or two of the
    # smallest would not fit in --max-size: its doing, not the skips'
    if (options.max_count > 1 and len(m.shards) > 1 and max(s.num_samples for s in m.shards) == 1
            and (not m.skipped or 2 * min(s.num_bytes for s in m.shards) > options.max_size)):
        average = human_bytes(m.num_bytes / m.num_samples)
        click.echo(f"note: every shard holds at most one sample: --max-size ({options.max_size:,} bytes) is below the "
                   f"size of a sample ({average} each in the shards, on average); loaders read shards of tens to "
                   "hundreds of MB best (the default is 256MB)")


def _note_loose_images(src: str) -> None:
    """After packing an ImageFolder tree from disk: say so when images lie directly in SRC. An
    ImageFolder keeps them in one folder per class and leaves those out, as torchvision does; a
    COCO images folder packed without --annotations looks just like that."""
    if is_remote(src) or not os.path.isdir(src):
        return
    with os.scandir(src) as entries:
        loose = sorted(e.name for e in entries if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES))
    if loose:
        click.echo(f"note: {len(loose):,} image file(s) directly in {src} (e.g. {loose[0]}) are in no class "
                   "folder and were left out, as ImageFolder does; for a COCO images folder, pass --annotations")

