"""Each run of an isolated training bench in a process of its own."""

from __future__ import annotations

import multiprocessing.context
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardkit.bench.isolate import GRACE_S, in_fresh_process


def _pid() -> int:
    return os.getpid()


def _refuse(what: str) -> None:
    raise ValueError(f"no {what}")


def _die() -> None:
    os._exit(3)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _TwoPartError(Exception):
    """Pickles, and does not unpickle: its ``__init__`` takes other arguments than it keeps."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


def _children_then_idle() -> tuple[int, float]:
    """Fork a child, stop it with SIGTERM, then idle 0.5 s with a SIGCHLD handler installed (as
    torch's DataLoader installs one): the child's exit code and the CPU seconds the idle took."""
    import multiprocessing

    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    child.terminate()
    child.join()
    t0 = time.process_time()
    time.sleep(0.5)
    return child.exitcode or 0, time.process_time() - t0


def _refuse_deep() -> None:
    _refuse("batch")


def _raise_two_part() -> None:
    raise _TwoPartError("/data/shard-7.tar", "truncated")


def test_each_call_is_a_new_process_that_is_gone_after_it() -> None:
    first, second = in_fresh_process(_pid), in_fresh_process(_pid)
    assert len({first, second, os.getpid()}) == 3
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)


def test_the_answer_is_handed_over_before_the_process_is_waited_for() -> None:
    got: list[int] = []

    def answered(pid: int) -> None:
        os.kill(pid, 0)  # not reaped yet (running, or a zombie): the answer came before the join
        got.append(pid)

    pid = in_fresh_process(_pid, answered=answered)
    assert got == [pid]
    with pytest.raises(ValueError):
        in_fresh_process(_refuse, "answer", answered=lambda _none: got.append(0))
    assert got == [pid]  # an error is no answer


def test_an_exception_comes_back_as_itself_and_a_death_is_named() -> None:
    with pytest.raises(ValueError, match="no batch"):
        in_fresh_process(_refuse, "batch")
    with pytest.raises(RuntimeError, match="the run of dali@8 died in its process"):
        in_fresh_process(_die, what="the run of dali@8")
    with pytest.raises(RuntimeError, match=r"without an answer \(killed by SIGKILL: out of memory\?\)"):
        in_fresh_process(_kill_self)


def test_a_run_that_forks_keeps_its_children_out_of_its_stop_and_idles_idle() -> None:
    """A forked child of the run (a DataLoader's worker) took the run's SIGTERM handler and
    wakeup pipe: torch terminating a slow worker stopped the whole run; and every SIGCHLD was
    re-sent to the run's main thread, which wrote another, for ever (0.7 CPU-s per idle second)."""
    code, idle_cpu = in_fresh_process(_children_then_idle)
    assert code == -signal.SIGTERM
    assert idle_cpu < 0.25, idle_cpu


def test_an_exception_brings_the_runs_traceback_and_one_that_cannot_travel_is_named() -> None:
    with pytest.raises(ValueError, match="no batch") as info:
        in_fresh_process(_refuse_deep)
    assert "in _refuse_deep" in str(info.value.__cause__)  # the run's own traceback
    with pytest.raises(RuntimeError, match=r"the run's error \(_TwoPartError: /data/shard-7.tar: truncated\) cannot "
                                           r"be sent back \(TypeError"):
        in_fresh_process(_raise_two_part)


def _sleep_after_writing_pid(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(600)


_BENCH = """
import signal, sys
from shardkit.bench.isolate import in_fresh_process
from shardkit.cli import _terminate  # the CLI's SIGTERM: raised in the main thread as Ctrl-C is
from tests.bench.test_isolate import _sleep_after_writing_pid
signal.signal(signal.SIGTERM, _terminate)
try:
    in_fresh_process(_sleep_after_writing_pid, sys.argv[1])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(143)
"""


def _start_bench(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """A bench-like script waiting on a run that sleeps; returns it and the run's pid."""
    pid_file = tmp_path / "run.pid"
    bench = subprocess.Popen([sys.executable, "-c", _BENCH, str(pid_file)], cwd=Path(__file__).parents[2],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # a process group of its own, as a terminal's job
    deadline = time.monotonic() + 60
    while not pid_file.exists():
        assert bench.poll() is None, bench.communicate()
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    return bench, int(pid_file.read_text())


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGTERM to the bench", "Ctrl-C"])
def test_a_terminated_bench_stops_its_run_at_once_instead_of_waiting_for_it(tmp_path: Path, how: str) -> None:
    """SIGTERM to the bench alone (`kill PID`, a scheduler's stop), and Ctrl-C, which a terminal
    sends to the bench and its run together: the run used to be stopped in its sleep only when
    the signal happened to reach its main thread, and otherwise killed after the grace period."""
    bench, run = _start_bench(tmp_path)
    t0 = time.monotonic()
    if how == "Ctrl-C":
        os.killpg(bench.pid, signal.SIGINT)
    else:
        bench.send_signal(signal.SIGTERM)
    out, err = bench.communicate(timeout=GRACE_S + 20)
    assert (bench.returncode, out.strip()) == (143, "interrupted"), err
    assert time.monotonic() - t0 < GRACE_S / 2  # the run unwound at once; nothing waited for its sleep
    assert _gone_within(run, 5)
    assert "Traceback" not in err, err


@pytest.mark.timeout(120)
def test_a_run_whose_bench_was_killed_stops_itself(tmp_path: Path) -> None:
    bench, run = _start_bench(tmp_path)
    bench.kill()  # no chance to stop the run: the run's lifeline closes
    bench.communicate(timeout=30)
    assert _gone_within(run, GRACE_S)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_the_run_starts_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that reaches the bench while it starts the run's process: SIGINT was ignored
    meanwhile (so that the run, which inherits it, does not print a traceback mid-import), and the
    Ctrl-C was dropped; the bench then went on. It is held instead, and raised once the run started."""
    real = multiprocessing.context.SpawnProcess.start

    def start(self: multiprocessing.context.SpawnProcess) -> None:
        real(self)
        os.kill(os.getpid(), signal.SIGINT)  # inside the start, as a Ctrl-C at that moment

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        in_fresh_process(_sleep, 15.0)
    assert time.monotonic() - t0 < 10  # stopped, not awaited


@pytest.mark.timeout(120)
def test_the_first_run_of_a_fresh_bench_starts_with_sigint_held_too() -> None:
    """A bench's first run starts multiprocessing's resource tracker, whose start unblocks SIGINT:
    that run's process imported torch with a Ctrl-C able to print a traceback there. In a fresh
    interpreter (no tracker yet), the run's process holds SIGINT from its first import on."""
    script = ("from shardkit.bench.isolate import in_fresh_process\n"
              "from tests.bench.mask_at_import import sigint_held_at_import\n"
              "print(in_fresh_process(sigint_held_at_import), in_fresh_process(sigint_held_at_import))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2], capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr[-2000:]

