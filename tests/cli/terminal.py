"""Run a command as a person would: in a pseudo-terminal (stdin, stdout, stderr all a tty), or
piped."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Seen:
    """What came back: the exit code and the bytes on the screen (``\\r\\n`` made ``\\n``)."""

    returncode: int
    text: str

    @property
    def lines(self) -> list[str]:
        """The lines left visible: colours removed, each line as its last carriage return redrew
        it."""
        return [line.rsplit("\r", 1)[-1] for line in _ANSI.sub("", self.text).split("\n")]


def shardkit_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardkit", *args]


#: The checkout these tests belong to: ``python -m shardkit`` puts the working directory first on
#: sys.path, so commands run from here, whatever directory pytest was started in.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env() -> dict[str, str]:
    env = dict(os.environ, TERM="xterm", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_in_pty(argv: list[str], *, columns: int = 0, rows: int = 24, timeout: float = 120.0,
               interrupt_after: bytes | None = None, interrupts: int = 1,
               interrupt_with: int = signal.SIGINT, interrupt_delay: float = 0.0) -> Seen:
    """Run ``argv`` on a fresh pty sized ``columns`` x ``rows`` (columns 0: unsized, 0x0, like
    ``script`` in CI; rows 0 with columns: only the width set, as some CI runners do).

    ``interrupt_after``: once this text has appeared, send SIGINT to the process group, as
    Ctrl-C does (``interrupts`` times, 0.2 s apart: an impatient user; ``interrupt_with``: another
    signal, e.g. SIGTERM as a scheduler sends it; ``interrupt_delay``: seconds to wait first, as a
    person reads before pressing it). Raises ``TimeoutError``
    (after killing the process) if it runs past ``timeout``: a hang is a failure.
    """
    master, slave = os.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=_env(), cwd=ROOT,
                            start_new_session=True, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"{argv} ran past {timeout} s; output so far: "
                                   f"{b''.join(chunks)!r}")
            if _readable(master, min(left, 0.5)):
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every holder of the slave side closed it
                    data = b""
                if not data:
                    break
                chunks.append(data)
                if interrupt_after is not None and interrupt_after in b"".join(chunks):
                    time.sleep(interrupt_delay)
                    for i in range(interrupts):
                        if i:
                            time.sleep(0.2)
                        with contextlib.suppress(ProcessLookupError):  # it may be gone already
                            os.killpg(proc.pid, interrupt_with)
                    interrupt_after = None
            elif proc.poll() is not None and not _pending(master):
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
    return Seen(code, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n"))


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has output within ``timeout`` seconds: ``poll``, which takes any descriptor,
    where ``select`` refuses one above 1023 (a test process that has opened many)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _pending(fd: int) -> bool:
    return _readable(fd, 0)


def run_piped(argv: list[str], *, timeout: float = 120.0) -> tuple[int, str, str]:
    """Run ``argv`` with stdout and stderr piped (not a terminal); ``(code, stdout, stderr)``."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(),
                          cwd=ROOT, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr
