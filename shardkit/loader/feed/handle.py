"""The training process's side of one feeder process: its process, pipe, ring and events
(:class:`Handle`), and stopping a set of them (:func:`close_all`). The pool
(:mod:`~shardkit.loader.feed.pool`) owns them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import torch

from shardkit._compat import hidden_main
from shardkit.errors import LoaderError
from shardkit.loader.feed.logs import LogRelay
from shardkit.loader.feed.process import feeder_main
from shardkit.loader.routes.choose import warned_routes

__all__ = ["Handle", "close_all"]


class Handle:
    """The loader's side of one feeder: its process, pipe, ring and events."""

    def __init__(self, part: int, payload: bytes, device_index: int | None, ctx: Any, logs: LogRelay) -> None:
        self.part = part
        self.bad = False  # a message half read or written (an interrupt): the pipe cannot be trusted
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=feeder_main, name=f"shardkit-feeder-{part}",
                                   args=(part, payload, device_index, os.getpid(), theirs, logs.queue, logs.levels,
                                         warned_routes()))
        try:
            with hidden_main():  # a feeder must not run the training script
                self.process.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            theirs.close()  # only the feeder holds its end: its exit closes the pipe
        self.images: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.ready: list[torch.cuda.Event] = []
        self.released: list[torch.cuda.Event] = []

    def died(self) -> LoaderError:
        self.process.join(timeout=2.0)
        code = self.process.exitcode
        hint = ""
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
            if code == -signal.SIGKILL:
                hint = ("; most likely the out-of-memory killer (check `dmesg`): fewer workers or feeders, "
                        "or feeders=0")
        else:
            how = f"exited with status {code}"
        return LoaderError(f"feeder process {self.part} (pid {self.process.pid}) {how}{hint}")

    def recv(self, timeout: float | None = None, doing: str = "answer") -> tuple[Any, ...]:
        """The next message; a dead feeder, one whose message cannot be read, or none within
        ``timeout`` seconds raises a LoaderError naming it (``doing``: what it did not do in time)."""
        waited = 0.0
        while True:
            try:
                if self.conn.poll(1.0):
                    return self.conn.recv()
            except (EOFError, OSError):
                raise self.died() from None
            except Exception as err:  # unpickling failed (e.g. CUDA IPC refused by the container)
                self.bad = True
                raise LoaderError(f"feeder process {self.part} (pid {self.process.pid}): cannot receive its message "
                                  f"({type(err).__name__}: {err}); use feeders=0") from err
            except BaseException:  # an interrupt, perhaps between a message's header and its body
                self.bad = True
                raise
            waited += 1.0
            if not self.process.is_alive():
                raise self.died()
            if timeout is not None and waited >= timeout:
                raise LoaderError(f"feeder process {self.part} (pid {self.process.pid}) did not {doing} within "
                                  f"{timeout:.0f} s")

    def send(self, *msg: Any) -> None:
        try:
            self.conn.send(msg)
        except (OSError, ValueError):
            raise self.died() from None
        except BaseException:
            self.bad = True
            raise


def close_all(handles: list[Handle], logs: LogRelay) -> None:
    """Ask every feeder to stop, then make sure it did (terminate, then kill, after a grace
    period), and handle the last of their log records. Copies still reading a ring are waited
    for and the ring is dropped first, so a feeder exits with none of its memory in use or
    mapped here."""
    for h in handles:
        for event in h.released:
            with contextlib.suppress(RuntimeError):
                event.synchronize()
        h.images, h.labels, h.ready, h.released = [], [], [], []
    for h in handles:
        with contextlib.suppress(OSError, ValueError):
            h.conn.send(("close",))
    deadline = time.monotonic() + 10.0
    for h in handles:
        h.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if h.process.is_alive():
            h.process.terminate()
            h.process.join(timeout=5.0)
        if h.process.is_alive():
            h.process.kill()
            h.process.join(timeout=5.0)
        h.conn.close()
    logs.close()
