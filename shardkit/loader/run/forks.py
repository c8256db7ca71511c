"""Forked children do not run the garbage collector over what they inherited.

A process that holds pinned or CUDA memory (a GPU route's staging slots, its decoded images, its
events) must not free it in a forked child: the memory's deleter calls CUDA, which a forked child
cannot, and the child ends in "Fatal Python error: Aborted" (a DataLoader worker "killed by
SIGABRT"). Python frees objects in reference cycles when the collector runs, which a child does as
soon as it allocates, so an inherited cycle that holds such memory is freed in the first worker
that collects it, whoever forked the worker: this loader, another ShardLoader, or a plain
``DataLoader`` forking its workers beside a GPU loader whose threads are running.

:func:`freeze_forked_children` registers fork hooks, once per process. Right before each
``fork()`` the collector is switched off (the parent switches it back on right after, if it was
on); the child, in its own hook, freezes every object it has (``gc.freeze``): what it inherited,
what other threads made in the parent while the fork waited (fork hooks registered before these,
logging's, run after them and may wait for a lock, as the fork may for the import lock), and what
earlier child hooks made. Only then does it switch its collector on, if it was on in the parent
when the first of the forks in progress began: it collects only what it allocates itself. Forks
from several threads at once count as one: the first switches the collector off, the last to
return in the parent switches it on again. The parent freezes and unfreezes nothing, so a
program's own freeze stays as it left it, and its children are protected as well. (Python 3.12
starts with a few hundred objects frozen: a design that stood aside for a program's own freeze
protected nothing there.)

What the hooks cannot cover: a child hook registered before these that collects (``gc.collect()``)
or switches the collector on, and another thread of the parent that switches the collector on
while a fork is in progress, let a collection run before the child has frozen what it has.

Frozen objects are never collected, but one can still be freed by its reference count: a cycle
the child makes and collects may hold the last reference left to an inherited object. So the
holders of such memory (a loader's epoch runner, with its route's staging slots, prefetcher and
decoded images and its pinned batches; its feeder pool, with the rings it opened) register with
:func:`keep_in_forked_children`, and a child keeps each one alive to its end: a reference each,
taken in the child's fork hook, nothing copied and nothing walked but the registered holders.
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
# whether the collector was on before the first of them; changed only under _state, which is never
# held across a fork.
_state = threading.Lock()
_forking = 0
_was_enabled = True
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
    global _forking, _was_enabled
    with _state:
        if _forking == 0:
            _was_enabled = gc.isenabled()
        _forking += 1
        gc.disable()  # until the child has frozen what it inherited


def _after_fork_in_parent() -> None:
    global _forking
    with _state:
        if _forking == 0:  # its before-hook was interrupted before it counted this fork
            return
        _forking -= 1
        if _forking == 0 and _was_enabled:
            gc.enable()


def _after_fork_in_child() -> None:
    global _state, _install_lock, _forking
    _state, _install_lock = threading.Lock(), threading.Lock()  # another thread may have held them at the fork
    try:
        _inherited.extend(_holders)
    finally:
        gc.freeze()  # everything inherited, whether or not the program froze some of it itself
        if _was_enabled:
            gc.enable()
        _forking = 0
