"""A feeder process body that starts late (for the tests of feeders started behind the first
batches): it sleeps :data:`DELAY_S` before the real one. Module-level, so the feeder process can
import it by name."""

from __future__ import annotations

import time
from typing import Any

from shardkit.loader.feed.process import feeder_main

DELAY_S = 10.0


def slow_feeder_main(*args: Any) -> None:
    time.sleep(DELAY_S)
    feeder_main(*args)
