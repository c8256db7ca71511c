"""Forked children do not run the garbage collector over what they inherited.

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
are frozen there too. Forks from several threads at once count as one: the first freezes, the
last to return in the parent unfreezes.

Frozen objects are never collected, but one can still be freed by its reference count: a cycle
the child makes and collects may hold the last reference left to an inherited object. So the
holders of such memory (a loader's epoch runner, with its route's staging slots, prefetcher and
decoded images and its pinned batches; its feeder pool, with the rings it opened) register with
:func:`keep_in_forked_children`, and a child keeps each one alive to its end: a reference each,
taken in the child's fork hook, nothing copied and nothing walked but the registered holders.

A program that froze objects itself is left alone: nothing is frozen, unfrozen or switched off for
it, so the freeze does not protect it (nor a grandchild, forked by a child that keeps the freeze);
its children still keep the registered holders.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

__all__ = ["freeze_forked_children", "keep_in_forked_children"]

_install_lock = threading.Lock()
_installed = False
# The forks in progress in this process (their before-hook has run, their after-hook not yet), and
# what the first of them decided; changed only under _state, which is never held across a fork.
_state = threading.Lock()
_forking = 0
_ours = False  # the forks in progress froze the objects and switched the collector off
_was_enabled = True  # the collector was on before they did
#: What a forked child keeps alive to its end: the holders registered while this process lived.
_holders: weakref.WeakSet[Any] = weakref.WeakSet()
#: In a forked child: the references to them that keep them alive.
_inherited: list[Any] = []


def freeze_forked_children() -> None:
    """From now on, every fork of this process freezes the collector's objects for the child
    (see the module doc). Idempotent."""
    global _installed
    with _install_lock:
        if not _installed:
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                after_in_child=_after_fork_in_child)
            _installed = True


def keep_in_forked_children(holder: Any) -> None:
    """Keep ``holder`` (an object that owns pinned or CUDA memory) alive, to their end, in the
    children forked while it lives in this process; installs the fork hooks
    (:func:`freeze_forked_children`)."""
    freeze_forked_children()
    _holders.add(holder)


def _before_fork() -> None:
    global _forking, _ours, _was_enabled
    with _state:
        if _forking == 0:
            _was_enabled = gc.isenabled()
            _ours = gc.get_freeze_count() == 0  # a program's own freeze: leave it alone
            if _ours:
                gc.disable()  # until the child has frozen what other threads make while the fork waits
        if _ours:
            gc.freeze()  # another fork in progress froze before: this adds what was made since
        _forking += 1


def _after_fork_in_parent() -> None:
    global _forking, _ours
    with _state:
        _forking -= 1
        if _forking == 0 and _ours:
            _ours = False
            gc.unfreeze()
            if _was_enabled:
                gc.enable()


def _after_fork_in_child() -> None:
    global _state, _install_lock, _forking, _ours
    _state, _install_lock = threading.Lock(), threading.Lock()  # another thread may have held them at the fork
    try:
        _inherited.extend(_holders)
    finally:
        if _ours:
            gc.freeze()  # what other threads made after the parent's freeze, while the fork waited
            if _was_enabled:
                gc.enable()
        _forking, _ours = 0, False
