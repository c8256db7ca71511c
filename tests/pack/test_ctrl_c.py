"""Ctrl-C reaching a pack's parent while it waits on its process pool (the library, no terminal)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli.terminal import ROOT

# Ctrl-C arrives while the parent waits for shards: from the progress callback (the parent's
# waiting loop calls it). And concurrent.futures.wait, were the parent to wait with it, would get it
# while it holds one future's lock, as the real one does while it takes them one by one: raised
# there, the lock stays held, the pool's manager thread blocks on it when it cancels that future,
# and the interpreter waits for that thread at exit for ever.
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
