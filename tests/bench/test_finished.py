"""A training bench stopped part-way keeps the runs it finished: its report, rows and ratios from
those runs only (made-up runs in place of the measured ones: no training here; whole stopped
runs are in test_train.py, test_train_detection.py and tests/cli/test_terminal.py)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit.bench import train
from shardkit.bench.finished import FinishedRuns, Interrupted
from shardkit.bench.train import TrainBenchConfig, TrainRun, format_train_table, run_train_bench
from shardkit.pack import PackOptions, pack


@pytest.fixture(scope="module")
def packed(tiny_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("finished") / "shards"
    pack(str(tiny_tree), str(dst), options=PackOptions(max_count=8), workers=1)
    return dst


def _stopped_after(runs: int, monkeypatch: pytest.MonkeyPatch,
                   interrupt: BaseException | None = None, *, answered_first: bool = False) -> list[str]:
    """Each isolated run answers at once, its fed rate 10 x its place in the order (10, 20, ...),
    until the one after ``runs``, which is interrupted while the bench waits for it (or, with
    ``answered_first``, once it has answered, while its process ends); returns the names of the
    runs asked for."""
    asked: list[str] = []
    rates: Iterator[float] = iter(range(10, 1000, 10))

    def in_fresh_process(_work: Any, _cfg: Any, name: str, _classes: int, first: bool, *, what: str,
                         answered: Callable[[TrainRun], object]) -> TrainRun:
        assert first == (not asked)  # the bench's first run says how long it will take
        asked.append(name)
        if len(asked) > runs and not answered_first:
            raise interrupt or KeyboardInterrupt()
        run = TrainRun(100.0, float(next(rates)), 0.25, None)
        answered(run)
        if len(asked) > runs:
            raise interrupt or KeyboardInterrupt()
        return run

    monkeypatch.setattr(train, "in_fresh_process", in_fresh_process)
    return asked


def _cfg(tree: Path, packed: Path, monkeypatch: pytest.MonkeyPatch) -> TrainBenchConfig:
    from shardkit.bench import dali

    monkeypatch.setattr(dali, "dali_available", lambda: True)  # its runs are made up too
    return TrainBenchConfig(imagefolder=str(tree), shards=str(packed), model="resnet18", size=32, batch_size=4,
                            workers=0, steps=1, warmup=0, repeats=2, device="cpu", compile=False,
                            contenders=("imagefolder", "shardloader", "dali"))


def test_a_stopped_bench_reports_its_finished_runs_and_pairs_only_finished_repetitions(
        tiny_tree: Path, packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Order: imagefolder, shardloader, dali, then dali, shardloader, imagefolder. Stopped in the
    fifth run: dali has both repetitions, the others the first; shardloader's ratio to DALI is
    repetition 1's alone (20/30), not against dali's second run."""
    interrupt = KeyboardInterrupt()
    asked = _stopped_after(4, monkeypatch, interrupt)
    with pytest.raises(Interrupted) as caught:
        run_train_bench(_cfg(tiny_tree, packed, monkeypatch))
    assert asked == ["imagefolder", "shardloader", "dali", "dali", "shardloader"]
    stopped = caught.value
    assert stopped.interrupt is interrupt and isinstance(stopped, KeyboardInterrupt)
    report = stopped.report
    assert report is not None
    assert report["interrupted"] == {"runs_finished": 4, "runs_planned": 6, "not_run": []}
    rows = {r["name"]: r for r in report["results"]}
    assert list(rows) == ["imagefolder", "shardloader", "dali"]
    assert [rows[n]["fed_images_per_second"]["runs"] for n in rows] == [[10.0], [20.0], [30.0, 40.0]]
    assert rows["shardloader"]["fed_over_best_dali"]["runs"] == pytest.approx([20 / 30])
    assert "fed_over_best_dali" not in rows["dali"]
    table = format_train_table(report)
    assert table.splitlines()[1] == "interrupted after 4 of 6 runs: the table holds the finished runs"
    assert "repetition: torchvision ImageFolder + DataLoader 0.33x; shardkit ShardLoader 0.67x." in table
    narrow = format_train_table(report, width=60)
    assert "interrupted after 4 of 6 runs: the table holds the finished" in narrow
    json.dumps(report)
    assert str(stopped) == "stopped after 4 of 6 runs"
    assert pickle.loads(pickle.dumps(stopped)).report == report


def test_a_contender_that_never_ran_has_no_row_and_is_named(tiny_tree: Path, packed: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _stopped_after(2, monkeypatch)  # stopped in dali's first run: no DALI row, no ratio to it
    with pytest.raises(Interrupted) as caught:
        run_train_bench(_cfg(tiny_tree, packed, monkeypatch))
    report = caught.value.report
    assert report is not None
    assert report["interrupted"] == {"runs_finished": 2, "runs_planned": 6, "not_run": ["dali"]}
    assert [r["name"] for r in report["results"]] == ["imagefolder", "shardloader"]
    assert not any("fed_over_best_dali" in r for r in report["results"])
    assert ("interrupted after 2 of 6 runs: the table holds the finished runs (not run: dali)"
            in format_train_table(report))


def test_a_run_that_answered_is_kept_when_the_stop_comes_while_its_process_ends(
        tiny_tree: Path, packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's process takes seconds to end after its answer (its CUDA context, compile workers): a
    Ctrl-C then used to drop a result already in hand."""
    _stopped_after(1, monkeypatch, answered_first=True)
    with pytest.raises(Interrupted) as caught:
        run_train_bench(_cfg(tiny_tree, packed, monkeypatch))
    report = caught.value.report
    assert report is not None and report["interrupted"]["runs_finished"] == 2


def test_a_bench_stopped_in_its_first_run_has_no_report(tiny_tree: Path, packed: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    after: list[str] = []
    _stopped_after(0, monkeypatch)
    with pytest.raises(Interrupted) as caught:
        run_train_bench(_cfg(tiny_tree, packed, monkeypatch), after_run=lambda name, _rep, _run: after.append(name))
    assert caught.value.report is None and after == [] and str(caught.value) == "stopped before a run finished"


def test_a_bench_that_ran_to_its_end_is_not_marked(tiny_tree: Path, packed: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _stopped_after(6, monkeypatch)
    report = run_train_bench(_cfg(tiny_tree, packed, monkeypatch))
    assert report["interrupted"] is None and [len(r["runs"]) for r in report["results"]] == [2, 2, 2]
    assert "interrupted" not in format_train_table(report)


def test_a_run_is_kept_before_after_run_is_called() -> None:
    """An interruption in ``after_run`` (printing the run's line) keeps the run it was told of."""
    def after_run(_name: str, _rep: int, _run: TrainRun) -> None:
        raise KeyboardInterrupt

    finished = FinishedRuns(["a", "b"], 1, after_run)
    with pytest.raises(Interrupted) as caught, finished.kept(lambda runs, mark: {"runs": runs, "interrupted": mark}):
        finished.add("a", 0, TrainRun(1.0, 1.0, 0.0, None))
    assert caught.value.report is not None
    assert caught.value.report["interrupted"] == {"runs_finished": 1, "runs_planned": 2, "not_run": ["b"]}
    assert list(caught.value.report["runs"]) == ["a"]


@pytest.mark.parametrize(("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_the_cli_prints_and_saves_what_a_stopped_bench_finished_and_exits_as_interrupted(
        tiny_tree: Path, packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_name: str,
        code: int) -> None:
    """Ctrl-C (130) or SIGTERM (143, a scheduler's stop) after one run: the table of that run, the
    report in --out marked, then the one line and exit status of any interrupted command."""
    from shardkit.cli import Terminated, cli

    _stopped_after(1, monkeypatch, Terminated() if signal_name == "SIGTERM" else KeyboardInterrupt())
    out = tmp_path / "r.json"
    base = ["bench", str(tiny_tree), "--shards", str(packed), "--train", "resnet18", "--size", "32", "--batch-size",
            "4", "--workers", "0", "--repeats", "2", "--contender", "imagefolder", "--contender", "shardloader"]
    result = CliRunner().invoke(cli, [*base, "--out", str(out)])
    assert result.exit_code == code, result.output
    assert "imagefolder" in result.stderr and "run 1/2: fed 10.0 img/s" in result.stderr
    assert result.stderr.endswith("\n" + ("terminated" if code == 143 else "interrupted") + "\n")
    lines = result.stdout.splitlines()
    assert lines[1] == "interrupted after 1 of 4 runs: the table holds the finished runs (not run: shardloader)"
    assert lines[3].startswith("torchvision ImageFolder + DataLoader ") and lines[-1] == f"report: {out}"
    report = json.loads(out.read_text())
    assert report["interrupted"] == {"runs_finished": 1, "runs_planned": 4, "not_run": ["shardloader"]}
    assert [len(r["runs"]) for r in report["results"]] == [1]
    _stopped_after(0, monkeypatch)  # stopped in its first run: nothing to print or save
    out.unlink()
    result = CliRunner().invoke(cli, [*base, "--out", str(out), "-q"])
    assert result.exit_code == 130 and result.stdout == "" and not out.exists()
    assert result.stderr == "no run had finished: nothing was measured, no report written\ninterrupted\n"


def test_a_run_lost_ends_the_bench_with_its_error_and_keeps_the_runs_before_it(
        tiny_tree: Path, packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose process dies (out of memory, a crash in native code) ends the bench with an error
    naming it, as before; the runs finished before it are printed and saved, not lost with it."""
    from shardkit.bench.isolate import RunLost
    from shardkit.cli import cli

    why = "the run of shardloader died in its process without an answer (killed by SIGKILL: out of memory?)"
    _stopped_after(1, monkeypatch, RunLost(why))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["bench", str(tiny_tree), "--shards", str(packed), "--train", "resnet18",
                                      "--size", "32", "--batch-size", "4", "--workers", "0", "--repeats", "2",
                                      "--contender", "imagefolder", "--contender", "shardloader", "--out", str(out)])
    assert result.exit_code == 1 and why in result.stderr, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == ("stopped by a lost run after 1 of 4 runs: the table holds the finished runs "
                        "(not run: shardloader)")
    report = json.loads(out.read_text())
    assert report["interrupted"] == {"runs_finished": 1, "runs_planned": 4, "not_run": ["shardloader"], "lost": why}
    assert [len(r["runs"]) for r in report["results"]] == [1]


@pytest.mark.parametrize("stop", ["interrupt", "lost run"])
def test_a_report_that_cannot_be_saved_at_a_stop_is_said_and_the_stop_keeps_its_exit(
        tiny_tree: Path, packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str) -> None:
    """The --out write fails at the stop (its disk filled meanwhile): its error line says where the
    report was kept, and the bench still ends as interrupted (130) or with the lost run's error."""
    import shardkit.bench
    import shardkit.cli
    from shardkit.bench.isolate import RunLost
    from shardkit.cli import cli

    why = "the run of shardloader died in its process without an answer (killed by SIGKILL: out of memory?)"
    _stopped_after(1, monkeypatch, KeyboardInterrupt() if stop == "interrupt" else RunLost(why))
    out = tmp_path / "r.json"
    real = shardkit.bench.write_json

    def full_disk(report: Any, path: str) -> None:
        if path == str(out):
            raise OSError(28, "No space left on device", path)
        real(report, path)

    monkeypatch.setattr(shardkit.bench, "write_json", full_disk)
    result = CliRunner().invoke(cli, ["bench", str(tiny_tree), "--shards", str(packed), "--train", "resnet18",
                                      "--size", "32", "--batch-size", "4", "--workers", "0", "--repeats", "2",
                                      "--contender", "imagefolder", "--contender", "shardloader", "--out", str(out)])
    assert "No space left on device); the report is kept in" in result.stderr, result.output
    kept = Path(result.stderr.split("the report is kept in ", 1)[1].split()[0])
    assert json.loads(kept.read_text())["interrupted"]["runs_finished"] == 1
    kept.unlink()
    if stop == "interrupt":
        assert result.exit_code == 130 and result.stderr.endswith("\ninterrupted\n")
    else:
        assert result.exit_code == 1 and result.stderr.rstrip().endswith(why)



def test_an_error_raised_while_an_interruption_unwinds_is_that_interruption() -> None:
    """A SIGTERM sent to the process group stops a DataLoader's workers too; torch's handler then
    raises its RuntimeError about them while the SIGTERM unwinds the run. The bench is stopped,
    with its finished runs, not failed with that error; an error with no interruption behind it
    still propagates."""
    from shardkit.cli import Terminated

    finished: FinishedRuns[TrainRun] = FinishedRuns(["a", "b"], 1)
    with pytest.raises(Interrupted) as caught, finished.kept(lambda runs, mark: {"runs": runs, "interrupted": mark}):
        finished.add("a", 0, TrainRun(1.0, 1.0, 0.0, None))
        try:
            raise Terminated()
        except KeyboardInterrupt:
            raise RuntimeError("DataLoader worker (pid 1234) is killed by signal: Terminated.") from None
    assert isinstance(caught.value.interrupt, Terminated)
    assert caught.value.report is not None and list(caught.value.report["runs"]) == ["a"]
    with pytest.raises(RuntimeError, match="a bug"), finished.kept(lambda runs, mark: {}):
        raise RuntimeError("a bug")


@pytest.mark.parametrize("again", [KeyboardInterrupt(), RuntimeError("Error calling __set_name__ on 'DviFont'")])
def test_a_stop_while_the_report_is_written_says_what_it_left_unwritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], again: BaseException) -> None:
    """Ctrl-C pressed twice: the second lands while the plot is drawn (matplotlib imported then; a
    Ctrl-C in a class body comes wrapped). The report is written, the plot is said not to be, and
    the stop goes on as the interruption it is; it was skipped without a word."""
    from shardkit.cli.bench_output import save_before_stopping

    interrupt = KeyboardInterrupt()
    if isinstance(again, RuntimeError):
        again.__context__ = interrupt

    def plot_report(report: dict[str, Any], path: str) -> None:
        raise again

    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    with pytest.raises(KeyboardInterrupt):
        save_before_stopping({"results": []}, str(out), str(plot), plot_report)
    assert json.loads(out.read_text()) == {"results": []} and not plot.exists()
    assert capsys.readouterr().err.splitlines()[-1] == "stopped again: plot not written"
