"""Forked children never collect what they inherited.

A process that holds pinned or CUDA memory (a GPU route's staging slots, its decoded images, its
events) must not free it in a forked child: the memory's deleter calls CUDA, which a forked child
cannot, and the child ends in "Fatal Python error: Aborted" (a DataLoader worker "killed by
SIGABRT"). Python frees objects in reference cycles when the collector runs, which a child does as
soon as it allocates, so an inherited cycle that holds such memory is freed in the first worker
that collects it, whoever forked the worker: this loader, another ShardLoader, or a plain
``DataLoader`` forking its workers beside a GPU loader whose threads are running.

:func:`freeze_forked_children` registers fork hooks, once per process: right before each
``fork()`` (with the GIL held, so no other thread allocates in between) the collector's objects
are frozen (``gc.freeze``); the parent unfreezes them right after, and the child keeps them
frozen: it collects only what it allocates itself. A program that froze objects itself is left
alone (nothing is frozen or unfrozen for it).
"""

from __future__ import annotations

import gc
import os
import threading

__all__ = ["freeze_forked_children"]

_lock = threading.Lock()
_installed = False
_froze = False  # whether the fork in progress froze the objects (and the parent must unfreeze them)


def freeze_forked_children() -> None:
    """From now on, every fork of this process freezes the collector's objects for the child
    (see the module doc). Idempotent."""
    global _installed
    with _lock:
        if not _installed:
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
            _installed = True


def _before_fork() -> None:
    global _froze
    _froze = gc.get_freeze_count() == 0  # a program's own freeze: leave it alone
    if _froze:
        gc.freeze()


def _after_fork_in_parent() -> None:
    global _froze
    if _froze:
        _froze = False
        gc.unfreeze()
