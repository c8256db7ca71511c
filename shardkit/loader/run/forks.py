"""Forked children never collect what they inherited.

A process that holds pinned or CUDA memory (a GPU route's staging slots, its decoded images, its
events) must not free it in a forked child: the memory's deleter calls CUDA, which a forked child
cannot, and the child ends in "Fatal Python error: Aborted" (a DataLoader worker "killed by
SIGABRT"). Python frees objects in reference cycles when the collector runs, which a child does as
soon as it allocates, so an inherited cycle that holds such memory is freed in the first worker
that collects it, whoever forked the worker: this loader, another ShardLoader, or a plain
``DataLoader`` forking its workers beside a GPU loader whose threads are running.

:func:`freeze_forked_children` registers fork hooks, once per process: right before each
``fork()`` the collector's objects are frozen (``gc.freeze``); the parent unfreezes them right
after, and the child keeps them frozen: it collects only what it allocates itself. Fork hooks
registered before these (logging's) run after them and may wait for a lock (so may the fork, for
the import lock), letting other threads run and make objects after the freeze; so the collector
is also off from the freeze until the child has frozen again in its own hook, and those objects
are frozen there too. A program that froze objects itself is left alone
(nothing is frozen, unfrozen or switched off for it).
"""

from __future__ import annotations

import gc
import os
import threading

__all__ = ["freeze_forked_children"]

_lock = threading.Lock()
_installed = False
_froze = False  # whether the fork in progress froze the objects (and switched the collector off)
_was_enabled = True  # whether the collector was on before that fork


def freeze_forked_children() -> None:
    """From now on, every fork of this process freezes the collector's objects for the child
    (see the module doc). Idempotent."""
    global _installed
    with _lock:
        if not _installed:
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                after_in_child=_after_fork_in_child)
            _installed = True


def _before_fork() -> None:
    global _froze, _was_enabled
    _froze = gc.get_freeze_count() == 0  # a program's own freeze: leave it alone
    if _froze:
        _was_enabled = gc.isenabled()
        gc.disable()  # until the child has frozen what other threads make while the fork waits
        gc.freeze()


def _after_fork_in_parent() -> None:
    global _froze
    if _froze:
        _froze = False
        gc.unfreeze()
        if _was_enabled:
            gc.enable()


def _after_fork_in_child() -> None:
    global _froze
    if _froze:
        _froze = False
        gc.freeze()  # what other threads made after the parent's freeze, while the fork waited
        if _was_enabled:
            gc.enable()
