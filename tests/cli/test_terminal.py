"""Every command as a person runs it: in a real pseudo-terminal (progress bar drawn) and piped.

These exist because ``shardkit pack`` once crashed in every terminal (``if bar:`` on a tqdm bar
without a total raises TypeError) while every CliRunner test, which is never a terminal, passed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.terminal import Seen, run_in_pty, run_piped, shardkit_argv
from tests.conftest import encode_image, write_tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("terminal") / "tree"
    write_tree(root, {f"class{c}/img{j}.jpg": encode_image((16 + j, 12 + c),
                                                           color=(c * 80, j * 40, 9))
                      for c in range(3) for j in range(8)})
    return root


@pytest.fixture(scope="module")
def packed(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("terminal") / "packed"
    code, _, err = run_piped(shardkit_argv("pack", str(tree), str(dst), "--max-count", "5",
                                           "--workers", "1", "-q"))
    assert code == 0, err
    return dst


def _clean(seen: Seen, code: int = 0) -> None:
    assert seen.returncode == code, seen.text
    assert "Traceback" not in seen.text and "TypeError" not in seen.text, seen.text


# 0x0: a pty nobody sized (script in CI), and 80x0 (only the width set): tqdm drew nothing
@pytest.mark.parametrize(("columns", "rows"), [(0, 0), (100, 24), (80, 0)])
def test_pack_in_a_terminal_shows_progress_and_summary(tree: Path, tmp_path: Path,
                                                       columns: int, rows: int) -> None:
    seen = run_in_pty(shardkit_argv("pack", str(tree), str(tmp_path / "out"), "--max-count", "5",
                                    "--workers", "2"), columns=columns, rows=rows)
    _clean(seen)
    # the bar: bytes with an image count
    assert "packing:" in seen.text and "/24 images" in seen.text
    assert "samples   24  (3 classes)" in seen.lines and "skipped   0" in seen.lines
    assert (tmp_path / "out" / "index.json").exists()


def test_pack_of_a_caption_table_in_a_terminal_counts_images_to_a_total(tree: Path, tmp_path: Path) -> None:
    """A table's rows have no file size to go by: the bar read "packing: | 0 B/0 B" with no total
    and no ETA. It counts the images, out of the table's rows."""
    images = sorted(p for p in tree.rglob("*") if p.is_file())
    table = tmp_path / "pairs.csv"
    table.write_text("image,caption\n" + "".join(f"{p},picture {i}\n" for i, p in enumerate(images)))
    seen = run_in_pty(shardkit_argv("pack", str(table), str(tmp_path / "out"), "--max-count", "5",
                                    "--workers", "1"), columns=100)
    _clean(seen)
    bars = [line for line in seen.text.replace("\r", "\n").split("\n") if "packing:" in line]
    assert bars and all("0 B/0 B" not in line for line in bars), bars
    assert any(f"/{len(images)} [" in line and "%" in line for line in bars), bars
    assert "samples   24" in seen.text


def test_pack_quiet_in_a_terminal_prints_nothing(tree: Path, tmp_path: Path) -> None:
    seen = run_in_pty(shardkit_argv("pack", str(tree), str(tmp_path / "out"), "--workers", "1",
                                    "-q"))
    _clean(seen)
    assert seen.text == ""


def test_pack_piped_has_no_bar(tree: Path, tmp_path: Path) -> None:
    code, out, err = run_piped(shardkit_argv("pack", str(tree), str(tmp_path / "out"), "--workers",
                                             "1"))
    assert code == 0 and err == "", err
    assert "samples   24  (3 classes)" in out.splitlines() and "packing" not in out


def test_pack_error_in_a_terminal_is_one_line(tmp_path: Path) -> None:
    seen = run_in_pty(shardkit_argv("pack", str(tmp_path / "missing"), str(tmp_path / "out")))
    _clean(seen, code=1)
    assert [line for line in seen.lines if line] == [f"error: {tmp_path / 'missing'}: source "
                                                     "directory does not exist"]
    assert "\x1b[31m" in seen.text  # red, for a person


def test_pack_from_a_bucket_in_a_terminal(tree: Path, tmp_path: Path, s3_server: dict[str, Any],
                                          s3_bucket: str) -> None:
    from tests.conftest import upload_tree

    upload_tree(tree, f"{s3_bucket}/train", s3_server)
    options = ["-o", f"client_kwargs.endpoint_url={s3_server['client_kwargs']['endpoint_url']}",
               "-o", "key=test", "-o", "secret=test"]
    seen = run_in_pty(shardkit_argv("pack", f"{s3_bucket}/train", str(tmp_path / "out"),
                                    "--max-count", "5", "--workers", "2", *options), columns=100)
    _clean(seen)
    # while it lists the bucket, a person sees that; then the bar draws over it
    assert f"listing {s3_bucket}/train …" in seen.text and "/24 images" in seen.text
    lines = [line for line in seen.lines if line.strip()]
    assert lines[0] == "samples   24  (3 classes)" and not any("listing" in line for line in lines)
    missing = f"{s3_bucket}/trian"
    seen = run_in_pty(shardkit_argv("pack", missing, str(tmp_path / "typo"), *options))
    _clean(seen, code=1)
    assert [line for line in seen.lines if line] == [
        f"error: {missing}: source directory does not exist (no object under this prefix)"]


@pytest.mark.parametrize("decode", [False, True])
def test_verify_in_a_terminal(packed: Path, decode: bool) -> None:
    seen = run_in_pty(shardkit_argv("verify", str(packed), *(["--decode"] if decode else [])),
                      columns=100)
    _clean(seen)
    assert (("verifying + decoding:" if decode else "verifying:") in seen.text
            and "0 B/100.0 KiB" in seen.text)  # bytes in the units of the summaries
    decoded = ", 24 images decoded" if decode else ""
    assert f"OK {packed}: 5 shards, 24 samples{decoded}" in seen.lines


def test_verify_piped_and_quiet(packed: Path) -> None:
    code, out, err = run_piped(shardkit_argv("verify", str(packed), "--decode"))
    assert (code == 0 and err == ""
            and out == f"OK {packed}: 5 shards, 24 samples, 24 images decoded\n")
    seen = run_in_pty(shardkit_argv("verify", str(packed), "-q"))
    _clean(seen)
    assert seen.text == ""


def test_verify_failure_in_a_terminal(packed: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in packed.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    shard = broken / "shard-000002.tar"
    shard.write_bytes(shard.read_bytes()[:1000])
    seen = run_in_pty(shardkit_argv("verify", str(broken)))
    _clean(seen, code=1)
    assert any(line.startswith(f"FAIL {shard}") for line in seen.lines)
    assert f"problem(s) in {broken}" in seen.text


def test_verify_counts_a_problem_every_sample_has_after_five(packed: Path, tmp_path: Path) -> None:
    """An index.json whose kind was edited printed one FAIL line per sample (300 alike)."""
    import shutil

    broken = tmp_path / "kind"
    shutil.copytree(packed, broken)
    index = json.loads((broken / "index.json").read_text())
    index["kind"] = "coco"
    index.pop("table", None)
    (broken / "index.json").write_text(json.dumps(index))
    code, _out, err = run_piped(shardkit_argv("verify", str(broken), "-q"))
    lines = err.splitlines()
    alike = [line for line in lines if line.endswith(": json is not {image, annotations, source} of one COCO image "
                                                     "(or a cls member is present)")]
    assert code == 1 and len(alike) == 6, err
    assert alike[-1].startswith("FAIL 19 more samples: json is not")
    assert lines[-1] == f"24 problem(s) in {broken}"
    for shard in broken.glob("*.tar"):  # a problem of each shard: every one named, each a file to mend
        shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    code, _out, err = run_piped(shardkit_argv("verify", str(broken), "-q"))
    assert sum(line.endswith(": sha256 differs from the manifest") for line in err.splitlines()) == 5, err


def test_info_in_a_terminal_and_piped(packed: Path) -> None:
    seen = run_in_pty(shardkit_argv("info", str(packed)))
    _clean(seen)
    assert "samples   24" in seen.lines and "shards    5  (4–5 samples each)" in seen.lines
    code, out, err = run_piped(shardkit_argv("info", str(packed)))
    assert code == 0 and err == "" and "samples   24" in out.splitlines()


def test_help_in_a_terminal_lists_every_command() -> None:
    seen = run_in_pty(shardkit_argv("--help"), columns=100)
    _clean(seen)
    for command in ("pack", "verify", "info", "bench", "doctor"):
        shown = any(line.strip().startswith(command + " ") for line in seen.lines)
        assert shown, (command, seen.text)


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_cleanly_and_the_rerun_resumes(tmp_path: Path) -> None:
    from sample_data.generate import make_imagenet_like

    src, dst = tmp_path / "src", tmp_path / "out"
    make_imagenet_like(src, classes=4, per_class=100, seed=0, size=(320, 240))
    argv = shardkit_argv("pack", str(src), str(dst), "--max-count", "10", "--workers", "2",
                         "--decode-check")
    seen = run_in_pty(argv, columns=100, interrupt_after=b"packing:")
    if seen.returncode == 0:
        pytest.skip("the pack finished before Ctrl-C arrived (machine too fast for this input)")
    _clean(seen, code=130)
    assert ([line for line in seen.lines if line.strip()]
            == ["interrupted; re-run the same command to resume"])
    assert not (dst / "index.json").exists()
    again = run_in_pty(argv, columns=100)
    _clean(again)
    assert "samples   400  (4 classes)" in again.lines
    code, out, err = run_piped(shardkit_argv("verify", str(dst)))
    assert code == 0 and out.startswith(f"OK {dst}: 40 shards, 400 samples"), err


@pytest.mark.slow
def test_ctrl_c_pressed_twice_stops_the_pack_without_hanging(tmp_path: Path) -> None:
    """Two Ctrl-C in a row reach the pack and its workers (the terminal signals the whole group):
    it used to print "interrupted" and then hang at exit, one run in four, joining workers that
    never got the pool's stop message."""
    from sample_data.generate import make_imagenet_like

    src = tmp_path / "src"
    make_imagenet_like(src, classes=4, per_class=250, seed=0, size=(320, 240))
    for attempt in range(4):
        dst = tmp_path / f"out{attempt}"
        argv = shardkit_argv("pack", str(src), str(dst), "--max-count", "64", "--workers", "2", "--jpeg-restart", "1")
        seen = run_in_pty(argv, columns=100, interrupt_after=b" images]", interrupts=2, timeout=60)
        if seen.returncode == 0:
            continue  # finished before Ctrl-C arrived
        _clean(seen, code=130)
        # the generated set holds 2 PNGs among 998 JPEGs: pack warns about that on a line of its own
        screen = [line for line in seen.lines if line.strip()]
        assert screen[-1] == "interrupted; re-run the same command to resume"
        assert all("--uniform-names" in line and line.startswith("shardkit: ") for line in screen[:-1])
        assert not (dst / "index.json").exists()
    # SIGTERM (a scheduler preempting the job) stops it the same way, exit 143; then it resumes
    dst = tmp_path / "terminated"
    argv = shardkit_argv("pack", str(src), str(dst), "--max-count", "64", "--workers", "2", "--jpeg-restart", "1")
    seen = run_in_pty(argv, columns=100, interrupt_after=b" images]", interrupt_with=signal.SIGTERM, timeout=60)
    if seen.returncode != 0:
        _clean(seen, code=143)
        screen = [line for line in seen.lines if line.strip()]
        assert screen[-1] == "terminated; re-run the same command to resume"
        assert all("--uniform-names" in line and line.startswith("shardkit: ") for line in screen[:-1])
    again = run_in_pty(argv, columns=100, timeout=120)
    _clean(again)
    assert "samples   1,000  (4 classes)" in again.lines
    assert any(line.startswith("shardkit: 1,000 images are 998 jpg and 2 png: ") for line in again.lines)


def test_ctrl_c_again_as_the_pack_exits_leaves_no_warning_below_the_message(tmp_path: Path) -> None:
    """Another Ctrl-C while the pack exits ends it at once, before multiprocessing's own clean-up:
    the resource tracker (which outlives it) then warned of leaked semaphores below "interrupted",
    the queues' names, when the first Ctrl-C came before every worker had opened them. The test
    above saw it only on a loaded machine, where its second Ctrl-C came late; here the second
    comes once the message is out, while the interrupted pack's queues are still referenced."""
    from sample_data.generate import make_imagenet_like

    src = tmp_path / "src"
    make_imagenet_like(src, classes=2, per_class=200, seed=0, size=(320, 240))
    script = (
        "import os, signal, sys\n"
        "import shardkit.cli as cli\n"
        "first, exit = cli._exit_at_once_on_another, sys.exit\n"
        "def again(status):\n"  # once the message is out
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    exit(status)\n"
        "def exiting(code):\n"
        "    first(code)\n"
        "    sys.exit = again\n"
        "cli._exit_at_once_on_another = exiting\n"
        "cli.main()\n"
    )
    for attempt in range(4):
        argv = [sys.executable, "-c", script, "pack", str(src), str(tmp_path / f"out{attempt}"),
                "--max-count", "16", "--workers", "2"]
        seen = run_in_pty(argv, columns=100, interrupt_after=b" images]", timeout=60)
        if seen.returncode == 0:
            continue  # finished before Ctrl-C arrived
        _clean(seen, code=130)
        screen = [line for line in seen.lines if line.strip()]
        assert screen[-1] == "interrupted; re-run the same command to resume", seen.text
        assert "resource_tracker" not in seen.text, seen.text
        break
    else:
        pytest.skip("the pack finished before Ctrl-C arrived (machine too fast for this input)")


def test_ctrl_c_during_verify_says_interrupted_without_promising_a_resume(packed: Path) -> None:
    seen = run_in_pty(shardkit_argv("verify", str(packed), "--decode"), columns=100,
                      interrupt_after=b"verifying")
    # finished before Ctrl-C, or it came as Python exited; its OK line may follow the bar's \r, not a \n
    if seen.returncode == 0 or re.search(r"[\r\n]\s*OK ", seen.text):
        pytest.skip("verify finished before Ctrl-C arrived")
    _clean(seen, code=130)
    assert [line for line in seen.lines if line.strip()] == ["interrupted"]


@pytest.mark.slow
def test_bench_in_a_terminal(tree: Path, packed: Path) -> None:
    args = ["bench", str(tree), "--shards", str(packed), "--workers", "0", "--batch-size", "4",
            "--size", "16", "--repeats", "1", "--epochs", "1", "--warmup", "0", "--no-webdataset"]
    seen = run_in_pty(shardkit_argv(*args), columns=100, timeout=300)
    _clean(seen)
    assert "timing:" in seen.text and "batch" in seen.text  # the bar, with its total
    assert any("ShardLoader" in line for line in seen.lines)
    code, out, err = run_piped(shardkit_argv(*args, "-q"), timeout=300)
    assert code == 0 and err == "", err
    assert "ShardLoader" in out


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "terminated")])
def test_a_training_bench_stopped_after_a_run_prints_and_saves_that_run(tree: Path, packed: Path, tmp_path: Path,
                                                                       signum: int, code: int, said: str) -> None:
    """Ctrl-C, or SIGTERM to the process group as ``timeout`` sends it, once the first of four
    isolated runs is over: its table and --out report, marked, then the exit of any interrupted
    command. The bench printed nothing and saved nothing, whatever it had measured."""
    out = tmp_path / "train.json"
    argv = shardkit_argv("bench", str(tree), "--shards", str(packed), "--train", "resnet18", "--size", "32",
                         "--batch-size", "4", "--workers", "0", "--steps", "1", "--warmup", "0", "--repeats", "2",
                         "--contender", "imagefolder", "--contender", "shardloader", "--out", str(out))
    # a second later: the next run's process is started, the bench waits for it
    seen = run_in_pty(argv, columns=100, interrupt_after=b"run 1/2", interrupt_with=signum, interrupt_delay=1.0,
                      timeout=300)
    _clean(seen, code=code)
    screen = [line for line in seen.lines if line.strip()]
    text = " ".join(line.strip() for line in screen)  # a note wrapped to the terminal, in one piece
    assert "interrupted after 1 of 4 runs: the table holds the finished runs (not run: shardloader)" in text
    assert "torchvision ImageFolder + DataLoader" in screen and not any("shardkit ShardLoader" in s for s in screen)
    assert screen[-2:] == [f"report: {out}", said]
    report = json.loads(out.read_text())
    assert report["interrupted"] == {"runs_finished": 1, "runs_planned": 4, "not_run": ["shardloader"]}
    assert [(r["name"], len(r["runs"])) for r in report["results"]] == [("imagefolder", 1)]


def test_another_ctrl_c_in_the_interpreters_last_instants_keeps_the_exit_code() -> None:
    """The interpreter gives SIGINT its default action back in its last instants (after the exit
    functions): a second Ctrl-C there ended the pack by the signal (-2) instead of with 130."""
    script = (
        "import os, signal, sys, time\n"
        "from shardkit.cli import _exit_at_once_on_another\n"
        "class Late:\n"
        "    def __del__(self):\n"  # a cycle: collected in the interpreter's last instants
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.2)\n"
        "late = Late()\n"
        "late.me = late\n"
        "_exit_at_once_on_another(130)\n"
        "sys.exit(130)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])


_CTRL_C_WHILE_IMPORTING = """
import runpy, sys

class CtrlC:  # Ctrl-C landing while the command line's modules import
    def find_spec(self, name, path, target=None):
        if name == "shardkit.cli.pack":
            raise KeyboardInterrupt

sys.meta_path.insert(0, CtrlC())
sys.argv = ["shardkit", "info", "nowhere"]
runpy.run_module("shardkit", run_name="__main__")
"""


def test_ctrl_c_while_the_command_imports_says_interrupted_not_a_traceback() -> None:
    """A Ctrl-C in the first few tenths of a second (``import shardkit.cli``, before any handler)
    printed a KeyboardInterrupt traceback."""
    done = subprocess.run([sys.executable, "-c", _CTRL_C_WHILE_IMPORTING], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parents[2])
    assert (done.returncode, done.stderr) == (130, "interrupted\n"), done.stderr[-2000:]


def test_ctrl_c_out_of_a_string_exec_still_exits_130_under_python_m(tmp_path: Path) -> None:
    """A KeyboardInterrupt that ends a string exec/eval (a namedtuple a lazy import builds: PIL's
    plugins during verify --decode) is marked unhandled by CPython even once caught, and
    ``python -m`` then ended the process by SIGINT (-2) after printing "interrupted"."""
    (tmp_path / "ctrl_c_in_exec.py").write_text(
        "import sys\n"
        "from shardkit.cli import cli, main\n"
        "@cli.command('boom')\n"
        "def boom() -> None:\n"
        "    exec('raise KeyboardInterrupt')\n"
        "sys.argv = ['shardkit', 'boom']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-m", "ctrl_c_in_exec"], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert (done.returncode, done.stderr.strip()) == (130, "interrupted"), done.stderr[-2000:]


@pytest.mark.slow
def test_a_loader_bench_stopped_by_sigterm_in_a_dataloaders_run_keeps_its_report_plot_and_exit(
        tree: Path, packed: Path, tmp_path: Path) -> None:
    """SIGTERM to the process group (``timeout``, a scheduler) while webdataset's DataLoader runs:
    its workers end by it too, and torch's handler then raised in the bench as it saved its report:
    no plot, exit 130 ("interrupted"), or no report at all where it came first."""
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    argv = shardkit_argv("bench", str(tree), "--shards", str(packed), "--workers", "2", "--batch-size", "4",
                         "--size", "16", "--repeats", "2", "--epochs", "40", "--warmup", "1",
                         "--out", str(out), "--plot", str(plot))
    # a third of a second into webdataset's first run (its progress bar's label)
    seen = run_in_pty(argv, columns=100, interrupt_after=b"webdataset run 1/2", interrupt_with=signal.SIGTERM,
                      interrupt_delay=0.3, timeout=300)
    # (a DataLoader worker the signal ends mid-handshake may print multiprocessing's traceback: not the bench's)
    assert seen.returncode == 143, seen.text
    screen = [line for line in seen.lines if line.strip()]
    assert screen[-3:] == [f"report: {out}", f"plot:   {plot}", "terminated"], seen.text
    assert json.loads(out.read_text())["interrupted"]["runs_finished"] >= 1 and plot.stat().st_size > 0
