"""``shardkit bench`` end to end on a tiny generated tree (no timing assertions)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.bench import SCHEMA
from shardkit.cli import cli
from shardkit.cli.bench import BenchError, share
from shardkit.cli.bench_output import save as _save
from shardkit.pack import PackOptions, pack


def test_bench_end_to_end(tree: Path, tmp_path: Path) -> None:
    """Into folders that do not exist yet: they are created (as pack creates its destination)."""
    out, png = tmp_path / "new" / "sub" / "r.json", tmp_path / "plots" / "r.png"
    result = CliRunner().invoke(cli, [
        "bench", str(tree), "--workers", "1", "--batch-size", "4", "--size", "32", "--repeats", "1",
        "--epochs", "1", "--warmup", "1", "--out", str(out), "--plot", str(png),
    ])
    assert result.exit_code == 0, result.output
    assert "torchvision ImageFolder + DataLoader [baseline]" in result.output
    assert "ShardLoader" in result.output and "webdataset" in result.output
    assert "\npack: 24 images" in result.output  # packed into a temporary directory first
    report = json.loads(out.read_text())
    assert report["schema"] == SCHEMA
    assert [r["name"] for r in report["results"]] == ["imagefolder", "webdataset", "shardloader"]
    for r in report["results"]:
        assert r["batch_shape"] == [4, 3, 32, 32]
        assert len(r["images_per_second"]["runs"]) == 1
    assert report["pack"]["images"] == 24
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_report_to_standard_output_is_all_that_goes_there(tree: Path) -> None:
    """``--out /dev/stdout`` piped on: the JSON alone on stdout (the table and ``report:`` line went
    there too, into the middle of it), and a reader that stops early (``| head``) is no error."""
    argv = [sys.executable, "-m", "shardkit", "bench", str(tree), "--workers", "1", "--batch-size", "4", "--size",
            "32", "--repeats", "1", "--epochs", "1", "--warmup", "1", "--no-webdataset", "-q", "--out", "/dev/stdout"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == SCHEMA
    assert "ShardLoader" in done.stderr and done.stderr.rstrip().endswith("report: /dev/stdout")
    head = subprocess.run(f"{' '.join(argv)} | head -c 11", shell=True, capture_output=True, text=True, timeout=240)
    assert head.stdout == '{\n  "schema' and "error" not in head.stderr, head.stderr


def test_a_table_piped_into_head_with_a_report_file_is_no_error(tree: Path, tmp_path: Path) -> None:
    """``bench ... --out r.json | head -1``: r.json was written, then the ``report:`` line met the
    closed pipe and the bench said it could not write r.json, kept a copy in /tmp, and exited 1."""
    out = tmp_path / "r.json"
    argv = [sys.executable, "-m", "shardkit", "bench", str(tree), "--workers", "1", "--batch-size", "4", "--size",
            "32", "--repeats", "1", "--epochs", "1", "--warmup", "1", "--no-webdataset", "-q", "--out", str(out)]
    done = subprocess.run(f"set -o pipefail; {' '.join(argv)} | head -1", shell=True, executable="/bin/bash",
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "error" not in done.stderr, done.stderr
    assert json.loads(out.read_text())["schema"] == SCHEMA


def test_bench_reuses_given_shards(tree: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    args = ["bench", str(tree), "--shards", str(shards), "--workers", "0", "--batch-size", "6",
            "--size", "16", "--repeats", "1", "--epochs", "1", "--warmup", "0", "--no-webdataset",
            "--transform", "val"]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert (shards / "index.json").exists() and "\npack: 24 images" in first.output
    second = CliRunner().invoke(cli, args)
    assert second.exit_code == 0, second.output
    assert "\npack: " not in second.output and "WebLoader" not in second.output


COCO = Path(__file__).resolve().parents[2] / "sample_data" / "coco"


def test_bench_on_a_coco_source(tree: Path, tmp_path: Path) -> None:
    """CocoDetection against ShardLoader's COCO route on the same images (those with annotations),
    with the same detection_train steps; lists of images are counted per image."""
    out, shards = tmp_path / "coco.json", tmp_path / "coco-shards"
    args = ["bench", str(COCO / "images"), "--annotations", str(COCO / "instances.json"), "--shards", str(shards),
            "--size", "64", "--max-size", "96", "--batch-size", "2", "--workers", "0", "--repeats", "1",
            "--epochs", "1", "--warmup", "1", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "torchvision CocoDetection + DataLoader [baseline]" in result.output
    assert "ShardLoader (COCO route)" in result.output and "detection_train(64, 96)" in result.output
    annotated = {a["image_id"] for a in json.loads((COCO / "instances.json").read_text())["annotations"]}
    report = json.loads(out.read_text())
    assert [r["name"] for r in report["results"]] == ["cocodetection", "shardloader"]
    assert report["conditions"]["data"]["images"] == len(annotated)
    assert report["pack"]["images"] == len(annotated)  # packed with drop_empty, like the baseline's images
    per_run = (len(annotated) // 2 - 1) * 2  # full batches after the warm-up one
    for r in report["results"]:
        assert r["images_per_run"] == per_run and r["batch_shape"] == [2]
    wrong = CliRunner().invoke(cli, ["bench", str(tree), "--shards", str(shards), "--workers", "0",
                                     "--batch-size", "2", "--repeats", "1", "--epochs", "1"])
    assert wrong.exit_code == 1 and "not be on the same data" in wrong.output


def test_the_train_choices_are_the_librarys_models_and_contenders() -> None:
    """The CLI spells them out (so that its --help imports no torch): they must be the library's."""
    from shardkit.bench.train import MODELS, TRAIN_CONTENDERS
    from shardkit.bench.train_detection import DETECTION_CONTENDERS, DETECTION_MODELS
    from shardkit.cli import bench
    from shardkit.cli.bench import bench_command

    choices = {p.name: tuple(p.type.choices) for p in bench_command.params  # type: ignore[attr-defined]
               if p.name in ("contenders", "train_model")}
    assert choices["contenders"] == tuple(dict.fromkeys(TRAIN_CONTENDERS + DETECTION_CONTENDERS))
    assert (bench.CLASSIFIER_CONTENDERS, bench.DETECTOR_CONTENDERS) == (TRAIN_CONTENDERS, DETECTION_CONTENDERS)
    assert choices["train_model"] == MODELS + DETECTION_MODELS


def test_a_report_that_cannot_be_written_is_kept_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "gone").write_text("a file where a folder was")
    with pytest.raises(BenchError, match=r"cannot write it \(.*\); the report is kept in (\S+)") as caught:
        _save({"schema": SCHEMA}, str(tmp_path / "gone" / "r.json"), None)
    kept = Path(str(caught.value).rsplit(" ", 1)[-1])
    assert json.loads(kept.read_text()) == {"schema": SCHEMA}
    kept.unlink()


def test_bench_runs_every_loader_with_more_workers_than_shards_and_an_unreadable_file(
        tree: Path, tmp_path: Path) -> None:
    """2 shards for 3 workers: webdataset (whole shards per worker) runs with 2, said before the
    timing; a corrupt file that pack skipped is left out by the ImageFolder baseline too, said
    likewise (it used to end the bench in a worker's PIL traceback)."""
    bad_tree = tmp_path / "tree"
    shutil.copytree(tree, bad_tree)
    (bad_tree / sorted(p.name for p in tree.iterdir())[0] / "zz_broken.jpg").write_bytes(b"not an image")
    shards = tmp_path / "shards"
    pack(str(bad_tree), str(shards), options=PackOptions(max_count=13), workers=1)
    result = CliRunner().invoke(cli, ["bench", str(bad_tree), "--shards", str(shards), "--workers", "3",
                                      "--batch-size", "4", "--size", "16", "--repeats", "1", "--epochs", "3",
                                      "--warmup", "0", "--transform", "val"])
    assert result.exit_code == 0, result.output
    assert "note: 1 unreadable source file left out by every loader, as pack skipped it: " in result.output
    assert "zz_broken.jpg: not an image" in result.output
    assert "2 shards cannot feed 3 workers: its baseline runs with 2 workers" in result.output
    assert "webdataset + WebLoader (PIL, 2 workers)" in result.output
    runs = [line for line in result.output.splitlines() if " run 1/1: " in line]
    assert len(runs) == 3 and len({line.index(" run 1/1") for line in runs}) == 1  # one column


def test_bench_says_what_it_does_before_torch_is_loaded(tree: Path) -> None:
    """torch and the data take seconds: a line comes first (here torch cannot even be imported)."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from shardkit.cli import cli\n"
            f"cli(['bench', {str(tree)!r}], prog_name='shardkit')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.startswith(f"bench: {tree}: loading torch and reading the data…\n"), done.stderr


def test_a_share_over_one_is_not_printed_as_a_percentage() -> None:
    assert share(0.5) == "50%" and share(1.0) == "100%"
    assert "%" not in share(1.68) and "%" not in share(1.004)  # as the table, which has ">100%" for it


def test_workers_take_auto_as_the_loader_does() -> None:
    import click

    from shardkit.cli.workers import WORKERS
    from shardkit.machine import auto_workers

    assert WORKERS.convert("auto", None, None) == auto_workers()
    assert WORKERS.convert("3", None, None) == 3
    for bad in ("lots", "-1", "1.5"):
        with pytest.raises(click.BadParameter):
            WORKERS.convert(bad, None, None)


def test_without_epochs_a_small_data_set_gets_as_many_as_it_needs(tree: Path, tmp_path: Path) -> None:
    """24 images at batch 8 make 3 batches an epoch: two epochs left 1 to time after the 5 of warm-up,
    and the bench refused to run unless --epochs was raised by hand. It now takes the fewest epochs
    that time at least three times what the workers prepare ahead (4 here: 7 timed batches), says
    so, and records them; --epochs given is kept, and 2 stays the count for a larger set."""
    from shardkit.bench.checks import epochs_for

    assert epochs_for(24, batch_size=8, warmup=5, workers=1) == 4
    assert epochs_for(10_000, batch_size=64, warmup=5, workers=8) == 2
    assert epochs_for(3, batch_size=8, warmup=5, workers=1) == 2  # no batch: the check says so
    assert epochs_for(300, batch_size=64, warmup=5, workers=0) == 3  # 4 an epoch: 2 epochs timed 3, too few for a ratio
    out = tmp_path / "r.json"
    base = ["bench", str(tree), "--workers", "1", "--batch-size", "8", "--size", "32", "--repeats", "1",
            "--no-webdataset", "-q"]
    result = CliRunner().invoke(cli, [*base, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "note: 4 epochs a run: 24 images make 3 batches of 8 an epoch" in result.output, result.output
    assert json.loads(out.read_text())["config"]["epochs"] == 4
    asked = CliRunner().invoke(cli, [*base, "--epochs", "2"])
    assert asked.exit_code == 1 and "raise --epochs" in asked.output, asked.output


def test_bench_runs_webdataset_whose_workers_read_less_than_a_batch(tree: Path, tmp_path: Path) -> None:
    """The bench packs 12 shards of 2 images for 4 workers: each webdataset worker read 6 images,
    no batch of 8, and after timing ImageFolder the bench ended in "webdataset: 0 batches in 3
    epoch(s) leave none to time". Its baseline now rebatches in the WebLoader, said before the
    timing, and times as many images as the others."""
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["bench", str(tree), "--workers", "4", "--batch-size", "8", "--size", "16",
                                      "--repeats", "1", "--epochs", "3", "--warmup", "0", "--transform", "val",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert ("note: webdataset's 4 workers read 6 images each from their shards, less than a batch of 8: "
            "its baseline keeps each worker's partial batches and rebatches them in the WebLoader") in result.output
    assert "webdataset + WebLoader (PIL, rebatched)" in result.output
    report = json.loads(out.read_text())
    assert {r["name"]: r["batch_shape"] for r in report["results"]}["webdataset"] == [8, 3, 16, 16]


def test_bench_counts_the_batches_each_webdataset_worker_makes_before_it_runs(tree: Path, tmp_path: Path) -> None:
    """Shards of 5, 5, 5, 5 and 4 images: webdataset's 2 workers read 14 and 10 and make one batch
    of 8 each an epoch, not the 3 the other loaders make. The check counted 3 and let a run through
    whose webdataset part timed no more than its workers prepare ahead; it now says so first."""
    shards = tmp_path / "shards"
    pack(str(tree), str(shards), options=PackOptions(max_count=5), workers=1)
    base = ["bench", str(tree), "--shards", str(shards), "--workers", "2", "--batch-size", "8", "--size", "16",
            "--repeats", "1", "--warmup", "0", "--transform", "val"]
    result = CliRunner().invoke(cli, [*base, "--epochs", "2", "-q"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: webdataset's 2 workers, each batching its own shards (14 and 10 images), "
                                    "make 4 batches of 8 in 2 epochs of 24 readable images, which leave 4 batches "
                                    "to time after --warmup 0, no more than the 4 that 2 workers prepare ahead"), \
        result.output
    chosen = CliRunner().invoke(cli, base)  # without --epochs: enough for webdataset's batches too
    assert chosen.exit_code == 0, chosen.output
    assert ("note: 6 epochs a run: 24 images make 3 batches of 8 an epoch (webdataset's workers, each batching its "
            "own shards: 2)") in chosen.output


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux's sched_setaffinity")
def test_a_training_bench_says_more_workers_than_cores_once(tree: Path, tmp_path: Path) -> None:
    """``--train`` leaves the loaders' warnings out as the loader bench does, and says it in one
    note too (it had said nothing)."""
    shards = tmp_path / "ds"
    pack(str(tree), str(shards), workers=1)
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "from shardkit.cli import cli\n"
            f"cli(['bench', {str(tree)!r}, '--shards', {str(shards)!r}, '--train', 'resnet18', '--workers', '2', "
            "'--batch-size', '4', '--size', '32', '--steps', '2', '--warmup', '1', '--repeats', '1', "
            "'--contender', 'shardloader'], prog_name='shardkit')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "UserWarning" not in done.stderr and "num_workers=2 is more than" not in done.stderr, done.stderr
    assert done.stderr.count("note: 2 workers a loader, more than the 1 core that is this process's share") == 1, \
        done.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
def test_more_workers_than_cores_is_said_once_without_torchs_warning(tree: Path) -> None:
    """On one usable core, 2 workers: torch's DataLoader printed its UserWarning (with the source
    line it came from) on building each baseline loader and on its first epoch, and ShardLoader
    its own warning every run; the bench says it once in a note instead."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "from shardkit.cli import cli\n"
            f"cli(['bench', {str(tree)!r}, '--workers', '2', '--batch-size', '8', '--size', '16', '--repeats', '1',"
            " '--epochs', '3', '--warmup', '0', '--transform', 'val'], prog_name='shardkit')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "UserWarning" not in done.stderr and "This DataLoader" not in done.stderr, done.stderr
    assert "num_workers=2 is more than" not in done.stderr, done.stderr  # ShardLoader's, once a run
    assert done.stderr.count("note: 2 workers a loader, more than the 1 core that is this process's share: the "
                             "workers take turns on them (--workers auto picks 1)") == 1, done.stderr


def test_the_packs_bench_makes_for_its_loaders_leave_out_packs_advice_on_mixed_formats(
        tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its loaders read every image member, whatever its extension: pack's advice to pack with
    --uniform-names (an option bench does not have) was printed mid-bench; packed by hand it stays."""
    from PIL import Image

    mixed = tmp_path / "mixed"
    shutil.copytree(tree, mixed)
    first = sorted(mixed.rglob("*.JPEG"))[0]
    Image.open(first).save(first.with_suffix(".png"))
    first.unlink()
    with caplog.at_level(logging.WARNING, logger="shardkit.pack"):
        result = CliRunner().invoke(cli, ["bench", str(mixed), "--workers", "1", "--batch-size", "8", "--size", "16",
                                          "--repeats", "1", "--epochs", "2", "--warmup", "0", "--transform", "val",
                                          "--no-webdataset", "-q"])
        assert result.exit_code == 0, result.output
        assert "--uniform-names" not in caplog.text + result.output
        pack(str(mixed), str(tmp_path / "by-hand"), workers=1)
    assert "pack with --uniform-names" in caplog.text


def test_a_bench_stopped_part_way_prints_and_saves_the_runs_it_finished(tree: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the third of four runs: the table and --out of the two finished, marked, then exit
    130. The loader bench printed 'interrupted' and nothing else, whatever it had measured."""
    from shardkit.bench import harness

    real, calls = harness.run_once, []

    def stopped_in_the_third(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(harness, "run_once", stopped_in_the_third)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["bench", str(tree), "--workers", "0", "--batch-size", "4", "--size", "16",
                                      "--repeats", "2", "--epochs", "2", "--warmup", "1", "--no-webdataset", "-q",
                                      "--out", str(out)])
    assert result.exit_code == 130, result.output
    assert "interrupted after 2 of 4 runs: the table holds the finished runs" in result.output
    assert result.output.rstrip().endswith(f"report: {out}\ninterrupted"), result.output
    report = json.loads(out.read_text())
    assert report["interrupted"] == {"runs_finished": 2, "runs_planned": 4, "not_run": []}
    assert [(r["name"], len(r["images_per_second"]["runs"])) for r in report["results"]] == [
        ("imagefolder", 1), ("shardloader", 1)]
    assert report["results"][1]["ratio_to_baseline"] is not None
