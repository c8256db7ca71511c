"""A module whose import waits until the file named by ``SHARDKIT_TEST_GATE`` exists (at most
60 s), after creating that name plus ``.reached``: put in the feeders' forkserver preload, it holds
the server "not ready" for as long as a test wants, and says when the server is held there.
Module-level, so the server can import it by name."""

from __future__ import annotations

import os
import time

_gate = os.environ.get("SHARDKIT_TEST_GATE")
if _gate:
    with open(_gate + ".reached", "a"):
        pass
_deadline = time.monotonic() + 60
while _gate and not os.path.exists(_gate) and time.monotonic() < _deadline:
    time.sleep(0.05)
