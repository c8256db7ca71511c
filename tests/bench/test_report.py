"""Report schema, paired ratios, the text table and the PNG plot, from synthetic runs."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shardkit.bench import (
    SCHEMA,
    Contender,
    RunResult,
    build_report,
    format_table,
    plot_report,
    write_json,
)
from shardkit.bench.report import check_writable, spread


def _run(ips: float, pss: int | None = 300 * 2**20) -> RunResult:
    return RunResult(images=1000, seconds=1000 / ips, first_batch_s=0.5, cpu_seconds=1.5,
                     cores_busy=1.9, peak_rss_bytes=900 * 2**20, wait_fraction=0.99,
                     batch_shape=(64, 3, 224, 224), peak_pss_bytes=pss)


def _report() -> dict:
    contenders = [Contender("imagefolder", "ImageFolder", list, baseline=True),
                  Contender("webdataset", "webdataset", list),
                  Contender("shardloader", "ShardLoader", list)]
    runs = {"imagefolder": [_run(500), _run(400), _run(450)],
            "webdataset": [_run(450), _run(400), _run(500)],
            "shardloader": [_run(1500), _run(1000), _run(1800, pss=None)]}
    conditions = {"machine": {"usable_cores": 2, "cpu_model": "test cpu"},
                  "versions": {"torch": "x"},
                  "data": {"images": 1000, "classes": 2, "mean_kb": 50.0, "mean_kpix": 190.0},
                  "page_cache": "warm", "shards_location": "local", "gpu": None}
    config = {"transform": "train", "size": 224, "batch_size": 64, "workers": 2, "device": "cpu",
              "epochs": 1, "warmup": 5, "repeats": 3}
    pack = {"images": 1000, "seconds": 0.5, "images_per_second": 2000.0, "shards": 8, "workers": 2}
    return build_report(config, conditions, pack, contenders, runs)


def test_report_schema_and_paired_ratios(tmp_path: Path) -> None:
    report = _report()
    assert report["schema"] == SCHEMA and report["baseline"] == "imagefolder"
    assert set(report) >= {"created", "config", "conditions", "pack", "results"}
    by_name = {r["name"]: r for r in report["results"]}
    assert by_name["imagefolder"]["images_per_second"]["median"] == pytest.approx(450)
    assert by_name["imagefolder"]["ratio_to_baseline"]["runs"] == pytest.approx([1, 1, 1])
    # Paired by repetition: 1500/500, 1000/400, 1800/450.
    assert by_name["shardloader"]["ratio_to_baseline"]["runs"] == pytest.approx([3.0, 2.5, 4.0])
    assert by_name["shardloader"]["ratio_to_baseline"]["median"] == pytest.approx(3.0)
    # same CPU/img
    assert by_name["shardloader"]["cpu_efficiency_to_baseline"]["median"] == pytest.approx(1.0)
    assert by_name["shardloader"]["peak_pss_mib"] is None  # one run without PSS
    assert by_name["webdataset"]["peak_pss_mib"] == pytest.approx(300)
    for r in report["results"]:
        assert set(r) >= {"label", "baseline", "first_batch_s", "cores_busy", "peak_rss_mib",
                          "wait_fraction", "cpu_seconds_per_1k_images", "batch_shape",
                          "images_per_run", "stages", "cpu_efficiency_to_baseline",
                          "load_average_1min"}
        assert set(r["images_per_second"]) == {"median", "min", "max", "q1", "q3", "runs"}
    path = tmp_path / "r.json"
    write_json(report, str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(report))


def test_a_report_stopped_while_it_is_written_leaves_the_file_it_found(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C while a stopped bench saves its report: the file is whole or as it was,
    never half a report, and no temporary file is left beside it."""
    path = tmp_path / "r.json"
    path.write_text('{"earlier": true}\n')

    def stopped(src: str, dst: str) -> None:  # the temporary file written, not yet in place
        assert json.loads(Path(src).read_text()) == {"schema": SCHEMA}
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_json({"schema": SCHEMA}, str(path))
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"earlier": True} and sorted(tmp_path.iterdir()) == [path]
    write_json({"schema": SCHEMA}, str(path))
    assert json.loads(path.read_text()) == {"schema": SCHEMA} and sorted(tmp_path.iterdir()) == [path]
    with pytest.raises(IsADirectoryError) as caught:  # an error names the file asked for
        write_json({"schema": SCHEMA}, str(tmp_path))
    assert caught.value.filename == str(tmp_path)


def test_a_report_written_through_a_symlink_keeps_the_link_and_the_files_mode(tmp_path: Path) -> None:
    """``--out`` a symlink (a results folder linked elsewhere): the file it names gets the report,
    the link stays a link, and an existing file keeps its mode (a rename of a new file would give
    it the default one)."""
    target, link = tmp_path / "kept" / "r.json", tmp_path / "r.json"
    target.parent.mkdir()
    target.write_text("{}")
    target.chmod(0o600)
    link.symlink_to(target)
    write_json({"schema": SCHEMA}, str(link))
    assert link.is_symlink() and json.loads(target.read_text()) == {"schema": SCHEMA}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]


def test_a_report_to_a_path_that_is_not_a_file_is_written_through_it(tmp_path: Path) -> None:
    """``--out /dev/stdout`` or a FIFO: written to, not replaced by a regular file."""
    fifo = tmp_path / "report"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_json({"schema": SCHEMA}, str(fifo))
    reader.join(10)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and json.loads(got[0]) == {"schema": SCHEMA}


def test_a_report_to_standard_output_reaches_the_pipe_it_is() -> None:
    """``--out /dev/stdout`` piped on (``| jq``): its link names a pipe with no path of its own."""
    script = "from shardkit.bench import write_json; write_json({'schema': 'x'}, '/dev/stdout')"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {"schema": "x"}, done.stderr


def test_a_writable_file_in_a_folder_that_takes_no_new_file_is_written_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary sibling cannot be made (a folder the user may not write, a file they may):
    the report goes into the file, as before there was a temporary file."""
    path = tmp_path / "r.json"
    path.write_text("{}")
    real_open = open

    def refusing(file: Any, *args: Any, **kwargs: Any) -> Any:
        if ".tmp-" in str(file):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing)
    write_json({"schema": SCHEMA}, str(path))
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"schema": SCHEMA} and sorted(tmp_path.iterdir()) == [path]


def test_table_text() -> None:
    text = format_table(_report())
    lines = text.splitlines()
    assert lines[0].startswith("loader") and set(lines[1]) <= {"-", " "}
    assert "ImageFolder [baseline]" in text and "3.00× (2.50–4.00)" in text
    assert "1,500" in text and "450" in text
    assert "2 cores (test cpu)" in text and "page cache warm" in text
    assert "pack: 1,000 images in 0.5 s = 2,000 img/s" in text
    # 1,000 images at a median 1,500 img/s: 0.67 s per run, too short to trust
    assert lines[-1].startswith("note: the shortest timed run took 0.67 s: figures this short move a lot")
    report = _report()
    for r in report["results"]:
        r["images_per_run"] = 10_000
    assert "note:" not in format_table(report)


def test_a_narrow_terminal_gets_a_block_per_loader() -> None:
    wide = format_table(_report())
    assert max(map(len, wide.splitlines())) > 80  # the table needs more than 80 columns
    narrow = format_table(_report(), width=80)
    assert max(map(len, narrow.splitlines())) <= 80
    lines = narrow.splitlines()
    assert lines[0] == "ImageFolder [baseline]"
    shardloader = lines[lines.index("ShardLoader") + 1]
    assert shardloader.startswith("    img/s 1,500 (1,000–1,800)   × baseline 3.00× (2.50–4.00)")
    assert "2 cores (test cpu)" in narrow.replace("\n  ", " ")
    assert format_table(_report(), width=400) == wide  # wide enough: the table


def test_plot_file_created(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    plot_report(_report(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spread() -> None:
    s = spread([4.0, 1.0, 3.0, 2.0])
    assert (s["median"], s["min"], s["max"]) == (2.5, 1.0, 4.0)
    assert s["q1"] <= s["median"] <= s["q3"]
    with pytest.raises(ValueError):
        spread([])


def test_a_run_of_too_few_batches_gets_no_ratio() -> None:
    """A run that timed 4 images (one batch) measures start-up, not the loader: no ratio is printed
    or drawn, and a note says why and what to change."""
    report = _report()
    for r in report["results"]:
        r["images_per_run"] = 4 * 64  # 4 batches of 64
    text = format_table(report)
    assert "×" not in "".join(line.split("  ")[-1] for line in text.splitlines()[2:5])
    assert "3.00×" not in text and "note: a run timed only 4 batches after its warm-up" in text
    assert "raise --epochs" in format_table(report, width=60).replace("\n  ", " ")
    for r in report["results"]:
        r["images_per_run"] = 5 * 64
    assert "3.00× (2.50–4.00)" in format_table(report) and "timed only" not in format_table(report)


def test_the_benchs_notes_are_under_the_table() -> None:
    report = _report()
    report["conditions"]["notes"] = ["webdataset splits whole shards between its workers"]
    assert "\nnote: webdataset splits whole shards between its workers" in format_table(report)


def test_where_a_report_cannot_go_is_known_before_the_run_and_nothing_is_left_there(tmp_path: Path) -> None:
    """``check_writable`` meets what ``write_json`` would, without writing: under /proc no file can
    be made, even by root (whom a check of permissions alone let through); the paths it passes are
    left as found."""
    with pytest.raises(OSError) as caught:
        check_writable("/proc/shardkit-report.json")
    assert caught.value.filename == "/proc/shardkit-report.json"
    import socket

    with socket.socket(socket.AF_UNIX) as server:  # open() refuses a socket: said before, not after
        server.bind(str(tmp_path / "sock"))
        with pytest.raises(OSError, match="No such device or address"):
            check_writable(str(tmp_path / "sock"))
    (tmp_path / "sock").unlink()
    new, old, fifo = tmp_path / "new.json", tmp_path / "old.json", tmp_path / "fifo"
    old.write_text("{}")
    os.mkfifo(fifo)
    for good in (new, old, fifo):  # a FIFO nobody reads yet: one may while the bench runs
        check_writable(str(good))
    assert sorted(tmp_path.iterdir()) == [fifo, old] and old.read_text() == "{}"
    cat = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)  # `cat fifo > report &`
    try:
        time.sleep(0.3)  # cat waits in its open() for a writer
        check_writable(str(fifo))  # opened and closed, it would give cat its end of input
        time.sleep(0.3)
        assert cat.poll() is None, "the check ended the reader's input"
        write_json({"schema": SCHEMA}, str(fifo))
        assert json.loads(cat.communicate(timeout=10)[0]) == {"schema": SCHEMA}
    finally:
        cat.kill()


def test_a_replaced_report_keeps_its_hard_links_and_its_owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A report file with another hard link is written in place (a rename would leave the link the
    old report); one of another owner keeps its owner and group (root saving into a user's file),
    written in place where the owner cannot be given (anyone else) and the file may be written,
    replaced as before where it may not."""
    path, other = tmp_path / "r.json", tmp_path / "also.json"
    path.write_text("{}")
    os.link(path, other)
    write_json({"schema": SCHEMA}, str(path))
    assert json.loads(other.read_text()) == {"schema": SCHEMA} and path.stat().st_ino == other.stat().st_ino
    if os.geteuid() != 0:
        return  # giving a file away takes root
    theirs = tmp_path / "theirs.json"
    theirs.write_text("{}")
    os.chown(theirs, 1234, 5678)
    write_json({"schema": SCHEMA}, str(theirs))
    assert (theirs.stat().st_uid, theirs.stat().st_gid) == (1234, 5678)
    assert json.loads(theirs.read_text()) == {"schema": SCHEMA}

    def refused(*_args: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "chown", refused)
    inode = theirs.stat().st_ino
    write_json({"schema": "again"}, str(theirs))
    assert theirs.stat().st_ino == inode and json.loads(theirs.read_text()) == {"schema": "again"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["also.json", "r.json", "theirs.json"]
    monkeypatch.setattr(os, "access", lambda *_args, **_kwargs: False)  # nor may it write the file: replaced
    write_json({"schema": "third"}, str(theirs))
    assert theirs.stat().st_ino != inode and json.loads(theirs.read_text()) == {"schema": "third"}
