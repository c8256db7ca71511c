"""``shardkit bench --train``: its settings and refusals, the CLI, and whole runs on the CPU (no timing
assertions); the table is tested in test_train_report.py, the measurement in test_train_measure.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from shardkit.bench import train
from shardkit.bench.finished import Interrupted
from shardkit.bench.train import (
    TrainBenchConfig,
    TrainStep,
    format_train_table,
    measure,
    run_train_bench,
)
from shardkit.cli import cli
from shardkit.pack import PackOptions, pack
from tests.bench.train_checks import check_runs, stop_in_run


@pytest.fixture(scope="module")
def packed(tiny_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("train") / "shards"
    pack(str(tiny_tree), str(dst), options=PackOptions(max_count=8), workers=1)
    return dst


def _cfg(tree: Path, packed: Path, **kw: object) -> TrainBenchConfig:
    base: dict[str, object] = {"imagefolder": str(tree), "shards": str(packed), "model": "resnet18", "size": 32,
                               "batch_size": 4, "workers": 0, "steps": 1, "warmup": 0, "repeats": 2,
                               "device": "cpu", "compile": False, "settle_s": 0, "isolate": False}
    return TrainBenchConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_report_has_every_run_and_share_is_fed_over_synthetic(tiny_tree: Path, packed: Path) -> None:
    order: list[tuple[str, int]] = []
    report = run_train_bench(_cfg(tiny_tree, packed), after_run=lambda name, rep, _run: order.append((name, rep)))
    assert order == [("imagefolder", 0), ("shardloader", 0), ("shardloader", 1), ("imagefolder", 1)]
    check_runs(report, ["imagefolder", "shardloader"], repeats=2)
    assert report["created"].endswith("+00:00") and "class_names" not in report["conditions"]["data"]
    table = format_train_table(report)
    assert "resnet18 @32 px" in table and "shardkit ShardLoader" in table and "share" in table
    json.dumps(report)  # JSON-able


def test_a_bench_stopped_in_a_run_reports_the_runs_it_finished(tiny_tree: Path, packed: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs (run_contenders): Ctrl-C in the fourth of four runs (imagefolder's second)
    leaves three measured, each row its finished repetitions."""
    stop_in_run(monkeypatch, 4)
    with pytest.raises(Interrupted) as caught:
        run_train_bench(_cfg(tiny_tree, packed))
    report = caught.value.report
    assert report is not None and report["interrupted"] == {"runs_finished": 3, "runs_planned": 4, "not_run": []}
    check_runs({**report, "results": report["results"][1:]}, ["shardloader"], repeats=2)
    check_runs({**report, "results": report["results"][:1]}, ["imagefolder"], repeats=1)
    assert format_train_table(report).splitlines()[1] == ("interrupted after 3 of 4 runs: the table holds the "
                                                          "finished runs")


def test_the_fed_run_takes_the_loaders_batches_across_epochs(tiny_tree: Path) -> None:
    """More steps than an epoch has batches: the measurement chains epochs and counts every step."""
    seen: list[int] = []

    class Loader:
        epochs = 0

        def __iter__(self):
            self.epochs += 1
            for i in range(2):  # two batches per epoch
                seen.append(i)
                yield torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.tensor([0, 1, 0, 1])

    step = TrainStep("resnet18", 2, torch.device("cpu"), compile=False)
    loader = Loader()
    run = measure(step, loader, steps=3, warmup=0, batch_size=4, settle_s=0)
    # the fixed (first) batch, the lead-in (warmup + steps), the timed steps: 7 batches, 4 epochs
    assert len(seen) == 1 + 3 + 3 and loader.epochs == 4
    assert run.fed_images_per_second > 0 and run.loader_gpu_ms_per_batch is None


def test_settings_are_checked(tiny_tree: Path, packed: Path) -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        run_train_bench(_cfg(tiny_tree, packed, model="vit"))
    with pytest.raises(ValueError, match="contenders"):
        run_train_bench(_cfg(tiny_tree, packed, contenders=("ffcv",)))
    with pytest.raises(ValueError, match="feeders must be 'auto' or an int from 0 to workers"):
        run_train_bench(_cfg(tiny_tree, packed, feeders=1))  # workers=0
    with pytest.raises(ValueError, match="shardloader_feeders contender needs workers >= 1"):
        run_train_bench(_cfg(tiny_tree, packed, contenders=("shardloader_feeders",)))  # workers=0
    with pytest.raises(ValueError, match="sleep_waits needs a cuda device and isolated runs"):
        run_train_bench(_cfg(tiny_tree, packed, sleep_waits=True))


def test_shards_of_other_data_and_a_batch_larger_than_the_data_are_refused_before_any_run(
        tiny_tree: Path, packed: Path, tmp_path: Path) -> None:
    """The loaders must be compared on the same images: the training bench checked nothing and
    timed ImageFolder on one tree against ShardLoader on another."""
    import shutil

    from sample_data.generate import make_imagenet_like

    other = tmp_path / "other"
    make_imagenet_like(other, classes=3, per_class=4, seed=1, size=(40, 30))
    with pytest.raises(ValueError, match=r"holds imagefolder data of 2 classes and 24 source images, but .*other has "
                                         r"3 classes and 12 images: the comparison would not be on the same data"):
        run_train_bench(_cfg(other, packed))
    renamed = tmp_path / "renamed"
    shutil.copytree(tiny_tree, renamed)
    first = sorted(p for p in renamed.iterdir() if p.is_dir())[0]
    first.rename(renamed / "zz-renamed")
    with pytest.raises(ValueError, match=r"names its classes otherwise than .*renamed \(class 0: '\w+' packed, "):
        run_train_bench(_cfg(renamed, packed))
    twin = tmp_path / "twin"  # the same classes and count, other photos
    make_imagenet_like(twin, classes=2, per_class=12, seed=5, size=(80, 60))
    with pytest.raises(ValueError, match=r"was packed from other files than .*twin holds \(the same classes and "
                                         r"number of images, other names or sizes"):
        run_train_bench(_cfg(twin, packed))
    with pytest.raises(ValueError, match="24 images make no full batch of 32: lower --batch-size"):
        run_train_bench(_cfg(tiny_tree, packed, batch_size=32))


def test_cli_refuses_an_option_of_the_other_bench_and_a_plot_that_is_no_png(tiny_tree: Path, packed: Path,
                                                                            tmp_path: Path) -> None:
    """Given on the command line, an option the chosen bench does not use was ignored without a word."""
    runner = CliRunner()
    base = ["bench", str(tiny_tree), "--shards", str(packed), "--size", "32", "--batch-size", "4", "-q"]
    for args, message in [(["--steps", "7"], "--steps: for --train, the training bench (the loader bench times "
                                             "--epochs): add --train MODEL or leave it out"),
                          (["--dali-threads", "4", "--no-isolate"], "--dali-threads, --no-isolate: for --train"),
                          (["--train", "resnet18", "--epochs", "3"], "--epochs: for the loader bench, which --train "
                                                                     "replaces (it times --steps): leave it out"),
                          (["--train", "resnet18", "--plot", str(tmp_path / "p.png")], "--plot: for the loader"),
                          (["--plot", str(tmp_path / "p.txt")], "--plot draws a PNG: name it"),
                          (["--plot", str(tmp_path / ".png")], "names no file (e.g. DIR/bench.png)"),
                          (["--plot", str(tmp_path) + "/"], "--plot"),
                          (["--out", str(tmp_path / "r.png"), "--plot", str(tmp_path / "r.png")],
                           "is also --out, the JSON report")]:
        result = runner.invoke(cli, base + args)
        assert result.exit_code in (1, 2) and message in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_cli_feeders_are_checked_and_reach_the_loader(tiny_tree: Path, packed: Path) -> None:
    runner = CliRunner()
    base = ["bench", str(tiny_tree), "--shards", str(packed), "--size", "32", "--batch-size", "4", "--steps", "1",
            "--warmup", "0", "--repeats", "1", "--no-isolate", "-q"]
    for args, message in [(["--train", "resnet18", "--feeders", "x"], "--feeders must be auto or a whole number"),
                          (["--train", "resnet18", "--feeders", "3", "--workers", "2"],
                           "--feeders must be from 0 to --workers (2)"),
                          (["--feeders", "1"], "--feeders applies to --train with a classifier"),
                          (["--feeders", "x"], "--feeders must be auto or a whole number"),
                          (["--train", "resnet18", "--feeders", "1", "--contender", "imagefolder"],
                           "--feeders sets the shardloader contender's feeders: add --contender shardloader"),
                          (["--sleep-waits"], "--sleep-waits is for --train with a classifier on --device cuda"),
                          (["--train", "resnet18", "--sleep-waits"],
                           "--sleep-waits is for --train with a classifier on --device cuda")]:
        wrong = runner.invoke(cli, [*base, *args])
        assert wrong.exit_code == 2 and message in wrong.output, wrong.output
    ok = runner.invoke(cli, [*base, "--train", "resnet18", "--feeders", "1", "--workers", "1",
                             "--contender", "shardloader"])
    assert ok.exit_code == 0, ok.output
    assert "shardkit ShardLoader, 1 feeder " in ok.output  # the CPU route in one feeder process


def test_the_fixed_feeders_contender_runs_autos_count_whatever_the_pace(tiny_tree: Path, packed: Path) -> None:
    """shardloader_feeders: the feeder count feeders="auto" would start on CUDA for --workers, as a
    fixed number (no trial), beside the shardloader row (here on the CPU route)."""
    from shardkit.loader.feed.layout import auto_feeders

    report = run_train_bench(_cfg(tiny_tree, packed, workers=2, repeats=1, contenders=("shardloader_feeders",)))
    [row] = report["results"]
    assert auto_feeders(2) == 1 and row["name"] == "shardloader_feeders"
    assert row["label"] == "shardkit ShardLoader, feeders fixed, 1 feeder"


def test_the_cpu_route_contender_feeds_uint8_batches_the_step_normalises(tiny_tree: Path, packed: Path) -> None:
    """shardloader_cpu: decode and crop in the workers, uint8 batches normalised inside the
    compiled step as the ImageFolder baseline's are."""
    cfg = _cfg(tiny_tree, packed, repeats=1, contenders=("shardloader_cpu",))
    _label, build = train._contenders(cfg)["shardloader_cpu"]
    images, labels = next(iter(build()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 32, 32) and labels.dtype == torch.int64
    [row] = run_train_bench(cfg)["results"]
    assert row["name"] == "shardloader_cpu" and row["label"].startswith("shardkit ShardLoader, CPU route")


def test_dali_contenders_need_dali(tiny_tree: Path, packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.bench import dali

    monkeypatch.setattr(dali, "dali_available", lambda: False)
    with pytest.raises(ValueError, match="need NVIDIA DALI"):
        run_train_bench(_cfg(tiny_tree, packed, contenders=("shardloader", "dali_files")))
    no_dali = CliRunner().invoke(cli, ["bench", str(tiny_tree), "--shards", str(packed), "--train", "resnet18",
                                       "--contender", "dali", "--device", "cpu", "-q"])
    assert no_dali.exit_code == 1 and "need NVIDIA DALI" in no_dali.output  # error:, as any missing input


def test_cli_needs_packed_shards_and_prints_the_table(tiny_tree: Path, packed: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli, ["bench", str(tiny_tree), "--train", "resnet18"])
    assert missing.exit_code == 2 and "--train needs --shards" in missing.output
    out = tmp_path / "train.json"
    # one contender, in a process of its own as by default (every contender: the in-process test above)
    ok = runner.invoke(cli, ["bench", str(tiny_tree), "--shards", str(packed), "--train", "resnet18", "--size", "32",
                              "--batch-size", "4", "--workers", "0", "--steps", "1", "--warmup", "0", "--repeats", "1",
                              "--contender", "shardloader", "--out", str(out), "-q"])
    assert ok.exit_code == 0, ok.output
    assert "share" in ok.output and json.loads(out.read_text())["schema"] == "shardkit.bench.train/1"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sleeping_waits_are_set_in_each_run_and_recorded(tiny_tree: Path, packed: Path) -> None:
    """Each isolated run sets its context's blocking sync before the context exists (the run fails
    if the driver refuses), and the report says the runs were made so."""
    report = run_train_bench(_cfg(tiny_tree, packed, device="cuda", isolate=True, repeats=1, sleep_waits=True,
                                  contenders=("shardloader",)))
    assert report["config"]["sleep_waits"] is True and report["results"][0]["fed_images_per_second"]["median"] > 0


def test_cli_dali_prefetch_reaches_the_config_and_is_checked(tiny_tree: Path, packed: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:

    seen: list[TrainBenchConfig] = []

    def run(cfg: TrainBenchConfig, after_run: Any = None) -> dict[str, Any]:
        seen.append(cfg)
        return {}

    monkeypatch.setattr(train, "run_train_bench", run)
    monkeypatch.setattr(train, "format_train_table", lambda *args, **kwargs: "")
    base = ["bench", str(tiny_tree), "--shards", str(packed), "--train", "resnet18", "--device", "cpu", "-q",
            "--contender", "shardloader"]
    assert CliRunner().invoke(cli, [*base, "--dali-prefetch", "3"]).exit_code == 0
    assert seen[0].dali_prefetch == 3
    wrong = CliRunner().invoke(cli, [*base, "--dali-prefetch", "0"])
    assert wrong.exit_code == 2 and "--dali-prefetch" in wrong.output
