"""``shardkit bench --train``: the step-fed measurement's plumbing, on the CPU (no timing assertions)."""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from shardkit.bench import step_timing, train
from shardkit.bench.report import spread
from shardkit.bench.train import (
    TrainBenchConfig,
    TrainStep,
    format_train_table,
    measure,
    run_train_bench,
)
from shardkit.cli import cli
from shardkit.pack import PackOptions, pack
from tests.bench.train_checks import check_runs


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


class _Recording:
    """A step that records which batch (its first value) each call took, and costs nothing."""

    device = torch.device("cpu")  # no device times measured (CUDA only)

    def __init__(self) -> None:
        self.taken: list[int] = []

    def to_device(self, batch: Any) -> tuple[Any, Any]:
        return batch[0], batch[1]

    def clone(self, batch: tuple[Any, Any]) -> tuple[Any, Any]:
        return batch[0].clone(), batch[1]

    def __call__(self, images: torch.Tensor, labels: Any, /) -> None:
        self.taken.append(int(images[0]))

    def sync(self) -> None:
        pass


def test_the_synthetic_runs_cycle_over_the_first_fixed_batches() -> None:
    """fixed_batches=3: each synthetic run takes clones of batches 0, 1, 2, 0, 1, …; the fed run
    goes on from 3: a lead-in of warmup + steps, then the timed steps."""
    step = _Recording()
    loader = [(torch.tensor([i]), None) for i in range(20)]  # one epoch of 20 batches
    measure(step, loader, steps=4, warmup=1, batch_size=1, fixed_batches=3, settle_s=0)
    assert step.taken == [0, 1, 2, 0, 1] + list(range(3, 3 + (1 + 4) + 4)) + [0, 1, 2, 0, 1]


def test_the_synthetic_rate_is_taken_over_both_synthetic_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step taking 2 ms a call in the first synthetic run and 20 ms in the second: the rate is
    their images over their seconds (20 / 0.22 s, about 91/s), neither run's alone (500/s or
    50/s). The bench's clock is a counter the step advances, so a busy machine cannot move it."""
    fixed_calls = 0
    now = [0.0]

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            now[0] += seconds

    class Slowing(_Recording):
        def __call__(self, images: torch.Tensor, labels: Any, /) -> None:
            nonlocal fixed_calls
            if int(images[0]) == 0:  # the fixed batch: a synthetic step
                fixed_calls += 1
                now[0] += 0.002 if fixed_calls <= 10 else 0.020
            else:  # a fed step
                now[0] += 0.001

    monkeypatch.setattr(train, "time", Clock)  # its settling pause
    monkeypatch.setattr(step_timing, "time", Clock)  # the steps' clock
    loader = [(torch.tensor([i]), None) for i in range(40)]
    run = measure(Slowing(), loader, steps=10, warmup=0, batch_size=1, settle_s=0)
    assert fixed_calls == 20
    assert run.synthetic_images_per_second == pytest.approx(20 / 0.22)


def test_the_fed_run_is_timed_after_the_read_ahead_is_used_up() -> None:
    """A loader whose thread keeps 12 batches ready (a full ring) and makes one every 10 ms: the
    pause before the synthetic run fills its queue, and the fed run's lead-in uses it up, so the
    timed rate is the loader's (about 100/s), not inflated by 12 free batches (which would read
    over 200/s over 12 timed steps)."""
    period, ready = 0.010, 12

    class ReadAhead:
        def __iter__(self) -> Iterator[tuple[torch.Tensor, None]]:
            made: queue.Queue[int] = queue.Queue(maxsize=ready)

            def produce() -> None:
                for i in itertools.count():
                    made.put(i)
                    time.sleep(period)

            threading.Thread(target=produce, daemon=True).start()
            while True:
                yield torch.tensor([made.get()]), None

    step = _Recording()
    run = measure(step, ReadAhead(), steps=12, warmup=2, batch_size=1, settle_s=0.3)
    assert run.fed_images_per_second < 1.25 / period
    assert run.host_wait_fraction > 0.5


def test_device_ms_is_none_off_cuda() -> None:
    from shardkit.bench.step_timing import device_ms

    assert device_ms(lambda: torch.ones(3) * 2, 2, torch.device("cpu")) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_ms_counts_kernels_of_every_thread() -> None:
    """A matmul run in another thread is counted (the GPU route decodes and augments in threads)."""
    import threading

    from shardkit.bench.step_timing import device_ms

    a = torch.randn(2048, 2048, device="cuda")

    def work() -> None:
        def matmul() -> None:
            a @ a
            torch.cuda.synchronize()

        t = threading.Thread(target=matmul)
        t.start()
        t.join()

    one = device_ms(lambda: a @ a, 4, torch.device("cuda"))
    threaded = device_ms(work, 4, torch.device("cuda"))
    assert one is not None and threaded is not None and one > 0
    assert 0.5 * one < threaded < 2 * one, (one, threaded)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sleeping_waits_are_set_in_each_run_and_recorded(tiny_tree: Path, packed: Path) -> None:
    """Each isolated run sets its context's blocking sync before the context exists (the run fails
    if the driver refuses), and the report says the runs were made so."""
    report = run_train_bench(_cfg(tiny_tree, packed, device="cuda", isolate=True, repeats=1, sleep_waits=True,
                                  contenders=("shardloader",)))
    assert report["config"]["sleep_waits"] is True and report["results"][0]["fed_images_per_second"]["median"] > 0


def test_the_table_calls_a_step_host_bound_when_its_device_time_is_well_under_its_wall_time() -> None:
    from shardkit.bench.train_report import train_table

    def row(synthetic: float, step_gpu_ms: float | None) -> dict[str, object]:
        one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
        return {"label": "x", "fed_images_per_second": one, "share": one, "host_wait_fraction": one,
                "synthetic_images_per_second": {**one, "median": synthetic}, "step_gpu_ms": step_gpu_ms,
                "loader_gpu_ms_per_batch": 0.7}

    bound = train_table("t", [row(12800.0, 5.5)], batch_size=128)  # 10 ms of wall time per step
    assert "10.0 (5.5)" in bound and "host-bound" in bound and "GPU time in brackets" in bound
    assert "host-bound" not in train_table("t", [row(12800.0, 9.5)], batch_size=128)
    on_cpu = train_table("t", [row(12800.0, None)], batch_size=128)
    assert "host-bound" not in on_cpu and "brackets" not in on_cpu


def test_profile_gil_summarises_py_spy_samples_by_thread() -> None:
    from benchmarks.experiments.gil.profile_gil import summarise

    raw = "\n".join([
        "thread (1): MainThread;<module> (x.py:1);step (x.py:2) 50",
        "thread (2);CompiledFunction.backward (y.py:3) 30",
        "thread (3): shardkit-decode;_guard (p.py:1);decode_many (s.py:2);jpegs (q.py:3) 15",
        "thread (4): shardkit-fetch;_guard (p.py:1);stage (q.py:9) 5",
    ])
    text = summarise(raw)
    assert text.splitlines()[:5] == ["100 samples holding the GIL", "   50.0%  training loop (main thread)",
                                     "   30.0%  autograd thread (backward)", "   20.0%  loader threads (shardkit-*)",
                                     "heaviest loader frames (innermost three):"]
    assert "15.0%  _guard > decode_many > jpegs" in text
    assert summarise("") == "no samples (py-spy could not read the process?)"


def test_the_table_gives_each_loader_over_the_fastest_dali_row_of_each_repetition() -> None:
    """Per repetition against the fastest DALI row of that repetition (two thread counts here), as
    a user comparing the two on one machine would: 12/10 and 11/10, not the medians' 11.5/9."""
    from shardkit.bench.train_report import against_best_dali, train_table

    def row(name: str, label: str, fed: list[float]) -> dict[str, object]:
        one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
        return {"name": name, "label": label, "fed_images_per_second": {**spread(fed)},
                "host_wait_fraction": one, "share": one, "synthetic_images_per_second": {**one, "median": 1e3},
                "step_gpu_ms": None, "loader_gpu_ms_per_batch": None}

    rows = [row("shardloader", "ShardLoader", [12.0, 11.0]), row("dali_files@8", "DALI, 8 threads", [10.0, 8.0]),
            row("dali_files@12", "DALI, 12 threads", [8.0, 10.0])]
    against_best_dali(rows, train.DALI_CONTENDERS)
    table = train_table("t", rows, batch_size=128)
    assert "over the fastest DALI row's in the same repetition: ShardLoader 1.15x (1.10x–1.20x)." in table
    assert "DALI, 8 threads 1" not in table
    without = [row("shardloader", "ShardLoader", [12.0]), row("imagefolder", "ImageFolder", [3.0])]
    against_best_dali(without, train.DALI_CONTENDERS)
    assert "DALI" not in train_table("t", without, batch_size=128)


def test_the_table_prints_no_share_over_100_percent_and_keeps_long_labels_in_their_column() -> None:
    from shardkit.bench.train_report import train_table

    def row(label: str, share: float) -> dict[str, object]:
        one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
        return {"label": label, "fed_images_per_second": one, "host_wait_fraction": one,
                "share": {**one, "median": share, "min": share, "max": share},
                "synthetic_images_per_second": {**one, "median": 1000.0}, "step_gpu_ms": None,
                "loader_gpu_ms_per_batch": None}

    long = "NVIDIA DALI webdataset (.dali.idx made by the bench), 16 threads"  # 63 characters
    table = train_table("t", [row(long, 1.68), row("shardkit ShardLoader", 0.8)], batch_size=128)
    assert "168%" not in table and ">100%" in table and "the machine's speed drifted" in table
    header, first, second = table.splitlines()[1:4]
    assert first.startswith(long + " ") and second.startswith("shardkit ShardLoader ")
    assert len({len(header), len(first), len(second)}) == 1  # one column width for every row


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_the_step_trains_on_uint8_and_on_normalised_batches(dtype: torch.dtype) -> None:
    """uint8 batches are normalised inside the step's loss function; float ones are taken as they are."""
    step = TrainStep("resnet18", 3, torch.device("cpu"), compile=False)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8).to(dtype)
    before = [p.detach().clone() for p in step.net.parameters()]
    step(images, torch.tensor([0, 2]))
    assert all(p.grad is None for p in step.net.parameters())  # dropped after the update
    assert any(not torch.equal(a, b) for a, b in zip(before, step.net.parameters(), strict=True))
    assert not step.opt.defaults.get("fused")  # fused SGD is for CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_step_uses_fused_sgd_on_cuda() -> None:
    step = TrainStep("resnet18", 3, torch.device("cuda"), compile=False)
    assert step.opt.defaults.get("fused") is True


def test_gpu_times_are_taken_after_every_timed_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profiler session slows every launch after it in the process: run_contenders profiles each
    contender on one more loader once all timed runs are over, and sets the figures on its runs."""
    events: list[str] = []

    class CudaLike(_Recording):
        device = torch.device("cuda")  # only read: nothing runs on a device

    def fake_device_ms(work: Any, n: int, device: torch.device) -> float:
        events.append("profile")
        work()
        return 2.5

    monkeypatch.setattr(step_timing, "device_ms", fake_device_ms)
    step = CudaLike()
    build = lambda: [(torch.tensor([i]), None) for i in range(40)]  # noqa: E731
    runs = train.run_contenders({"a": (step, build), "b": (step, build)}, steps=3, warmup=1, batch_size=1,
                                repeats=2, settle_s=0, after_run=lambda name, rep, run: events.append("run"))
    assert events[:4] == ["run"] * 4 and set(events[4:]) == {"profile"} and len(events) == 8
    assert all(r.step_gpu_ms == 2.5 and r.loader_gpu_ms_per_batch == 2.5 for rs in runs.values() for r in rs)


def test_cli_dali_prefetch_reaches_the_config_and_is_checked(tiny_tree: Path, packed: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.bench import train

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
