"""Feeder processes starting in the background while the route runs in the training process.

A :class:`~shardkit.loader.feed.pool.FeederPool` takes seconds to start (each feeder starts its
CUDA context, its decoder and its workers: 7-8 s on an H200 with three). With
``feeders="auto"`` the loader does not wait for it: :class:`PoolStart` starts the pool in a
thread, the first batches come from the route in the training process, and the loader hands the
epoch over to the feeders at the first batch after they are up. Both deliver the same batches
(tested bit for bit), so where a batch was made does not show in what the loop gets.

Example:
    >>> class Pool:
    ...     device = None
    ...     def start(self): pass
    ...     def close(self): pass
    >>> s = PoolStart(Pool())
    >>> s.wait(5.0) and s.error is None
    True
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from typing import Any

import torch

__all__ = ["EXIT_WAIT_S", "PoolStart"]

#: How long interpreter exit waits for a start still under way to end (its feeders are then
#: stopped), so that no feeder is left half-started by a script that ends while they start.
EXIT_WAIT_S = 60.0


class PoolStart:
    """``pool.start()`` in a daemon thread (``shardkit-feeders-start``). :attr:`ready` once it
    returned; :attr:`error` what it raised, if anything. :meth:`abandon` closes the pool whenever
    its start ends (at once if it already has): a loader closed while its feeders start leaves
    none running, and at interpreter exit the pool is abandoned and its start waited for (at most
    :data:`EXIT_WAIT_S`). The pool's CUDA device is fixed here, in the calling thread, whose
    current device is the one the training loop uses (a thread of its own would see device 0)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        device = getattr(pool, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda" and device.index is None:
            pool.device = torch.device("cuda", torch.cuda.current_device())
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="shardkit-feeders-start", daemon=True)
        # before multiprocessing's own exit hook (atexit runs the last registered first): a script
        # ending while the feeders start waits for the start to end, then stops them
        atexit.register(self._at_exit)
        self._thread.start()

    @property
    def ready(self) -> bool:
        """Whether the start has ended (check :attr:`error` for how; abandoned: and the pool is
        closed again)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the start to end; True if it did within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            device = getattr(self.pool, "device", None)
            if isinstance(device, torch.device) and device.type == "cuda":
                with torch.cuda.device(device):
                    self.pool.start()
            else:
                self.pool.start()
        except BaseException as err:  # handed to the loader, which falls back or raises
            self.error = err
        with self._lock:
            close = self._abandoned and self.error is None
            if not close:
                self._done.set()
        if close:  # abandoned while it started: ended only once its feeders are stopped again
            try:
                self.pool.close()
            finally:
                self._done.set()
        # a started pool is the loader's now (its own finalizer stops it at exit)
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        self.abandon()
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C at exit: stop waiting
            self._done.wait(EXIT_WAIT_S)

    def abandon(self) -> None:
        """The loader will not use this pool: close it now, or when its start ends."""
        with self._lock:
            self._abandoned = True
            close = self._done.is_set() and self.error is None
        if close:
            self.pool.close()
