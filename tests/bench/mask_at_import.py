"""Imported by a bench run's process before its own signal set-up: what it held (blocked) then."""

from __future__ import annotations

import signal

BLOCKED_AT_IMPORT = signal.pthread_sigmask(signal.SIG_BLOCK, set())


def sigint_held_at_import() -> bool:
    return signal.SIGINT in BLOCKED_AT_IMPORT
