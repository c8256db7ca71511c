"""Ctrl-C reaching a pack's parent while it waits on its process pool (the library, no terminal)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli.terminal import ROOT

# Ctrl-C arrives from the progress callback (the parent's waiting loop calls it). And were the
# parent to wait with concurrent.futures.wait again, that gets it while it holds one future's lock,
# as the real one can while it takes them one by one: raised there, the lock stays held, the pool's
# manager thread blocks on it when it cancels that future, and the interpreter waits for that
# thread at exit for ever (the hang of the code before this test).
_SCRIPT = textwrap.dedent("""
    import concurrent.futures, concurrent.futures._base as base, signal, sys

    real_wait = base.wait

    def wait(fs, timeout=None, return_when="ALL_COMPLETED"):
        held = sorted(fs, key=id)[0]._condition
        held.acquire()
        signal.raise_signal(signal.SIGINT)
        try:
            return real_wait(fs, timeout, return_when)
        finally:
            held.release()

    concurrent.futures.wait = base.wait = wait  # before shardkit imports it
    from shardkit.pack import PackOptions, pack

    samples, seen = [], []

    def progress(n):
        samples.append(n)
        if len(samples) == 2:
            seen.append((signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])))
            signal.raise_signal(signal.SIGINT)

    try:
        pack(sys.argv[1], sys.argv[2], options=PackOptions(max_count=2), workers=2, progress=progress)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    else:
        print("not interrupted", flush=True)
        print(f"progress calls {samples}, SIGINT handler and blocked signals when raised: {seen}",
              file=sys.stderr)
""")


@pytest.mark.slow
def test_ctrl_c_while_waiting_on_the_pool_stops_the_pack_and_exits(small_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    try:
        done = subprocess.run([sys.executable, "-c", _SCRIPT, str(small_tree), str(dst)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the interrupted pack did not exit: {err.stdout!r} {err.stderr!r}")
    assert (done.returncode, done.stdout) == (0, "interrupted\n"), done.stderr
    assert not (dst / "index.json").exists()


# Ctrl-C from outside (another thread signals the main one, as a terminal's reaches it) while the
# parent is blocked waiting for shards that take a while (restart-indexed transcoding).
_FROM_OUTSIDE = textwrap.dedent("""
    import os, signal, sys, threading
    from shardkit.pack import PackOptions, pack

    main, timers = threading.main_thread().ident, []

    def progress(n):
        if not timers:
            timers.append(threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT)))
            timers[0].start()

    try:
        pack(sys.argv[1], sys.argv[2], options=PackOptions(max_count=4, jpeg_restart=1), workers=2,
             progress=progress)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    else:
        print("not interrupted", flush=True)
""")


@pytest.mark.slow
def test_ctrl_c_from_outside_while_the_parent_waits_stops_the_pack(tmp_path: Path) -> None:
    from sample_data.generate import make_imagenet_like

    src, dst = tmp_path / "src", tmp_path / "out"
    make_imagenet_like(src, classes=2, per_class=100, seed=0, size=(320, 240))
    try:
        done = subprocess.run([sys.executable, "-c", _FROM_OUTSIDE, str(src), str(dst)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the interrupted pack did not exit: {err.stdout!r} {err.stderr!r}")
    if done.stdout == "not interrupted\n":
        pytest.skip("the pack finished within 0.1 s of its first sample (machine too fast for this input)")
    assert (done.returncode, done.stdout) == (0, "interrupted\n"), done.stderr
    assert not (dst / "index.json").exists()
