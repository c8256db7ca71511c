"""The names the operating system shows for the loader's threads (``top -H``, ``ps -L``,
``/proc/<pid>/task/<tid>/comm``, profilers): a Python thread's name stays inside Python, so a
loader's threads (the device prefetcher's stages, a feeder's watchers) would all show as
``python``. Linux only, and best effort: elsewhere, or where the call fails, nothing changes."""

from __future__ import annotations

import ctypes
import sys
import threading

__all__ = ["OS_NAME_LENGTH", "name_this_thread"]

#: Linux keeps the first 15 bytes of a thread's name.
OS_NAME_LENGTH = 15

_PR_SET_NAME = 15  # prctl option (linux/prctl.h)
_libc: ctypes.CDLL | None = None


def name_this_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (by default its Python name) where the OS shows thread
    names, cut to :data:`OS_NAME_LENGTH` bytes. True when the OS took it."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    text = (name if name is not None else threading.current_thread().name).encode("utf-8", "replace")
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return bool(_libc.prctl(_PR_SET_NAME, ctypes.c_char_p(text[:OS_NAME_LENGTH]), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
