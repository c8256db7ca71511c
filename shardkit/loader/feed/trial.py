"""``feeders="auto"`` once its feeders run: time the training loop fed by them and fed by the
route in this process, and keep the faster.

Why: whether feeders help depends on the step, not only on the machine. Measured on an H200
(docs/performance.md, "Feeders against none"), three feeders fed a compiled ResNet-18 step at
batch 128 1.20x faster than the route in the training process (the step was host-bound, and the
feeders took the route's host work out of its interpreter), but at batch 256 0.947x as fast (the
step was bound by the GPU, where the feeders' decode kernels take turns with the step's: each
process has a CUDA context of its own). Only the loop itself can tell.

**How.** The loop's pace is the time between its requests for batches (its whole iteration:
step, logging, the wait for the batch). Once the feeders are up, :class:`PaceTrial` lets them
deliver :data:`SKIP` + :data:`WINDOW` batches, then the route in this process as many, and takes
the median of the last :data:`WINDOW` intervals of each; the feeders stay only if their median
is at least :data:`MARGIN` shorter (on a tie the route stays here: fewer processes, less CPU).
The batches are the same either way; only where they are made changes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["MARGIN", "SKIP", "WINDOW", "PaceTrial", "Place"]

#: Batches after a switch whose intervals are not timed (the new side filling its pipeline).
SKIP = 8
#: Intervals timed on each side.
WINDOW = 24
#: How much shorter the feeders' median interval must be for them to stay.
MARGIN = 0.02

#: Where the route runs: in the feeder processes, or in this one.
Place = Literal["feeders", "here"]


@dataclass
class PaceTrial:
    """The trial's state: which side delivers now (:attr:`place`), the median interval timed on
    each side so far (:attr:`paces`), and once both are timed, the side kept (:attr:`decided`)."""

    skip: int = SKIP
    window: int = WINDOW
    margin: float = MARGIN
    place: Place = "feeders"
    paces: dict[str, float] = field(default_factory=dict)
    decided: Place | None = None
    _seen: int = 0  # intervals since the side last changed
    _intervals: list[float] = field(default_factory=list)
    _last: float | None = None

    def restart_clock(self) -> None:
        """The loop's next request does not end an interval (a new iteration's first: the time
        between epochs is the loop's own)."""
        self._last = None

    def request(self, now: float) -> None:
        """The loop asks for its next batch at ``now`` (a monotonic clock's seconds): time the
        interval since its last request, and move on to the other side (or decide) once this
        side's window is full."""
        if self.decided is not None:
            return
        if self._last is not None:
            self._seen += 1
            if self._seen > self.skip:
                self._intervals.append(now - self._last)
        self._last = now
        if len(self._intervals) < self.window:
            return
        self.paces[self.place] = statistics.median(self._intervals)
        self._intervals, self._seen = [], 0
        if len(self.paces) < 2:
            self.place = "here" if self.place == "feeders" else "feeders"
            return
        self.decided = self.place = (
            "feeders" if self.paces["feeders"] < self.paces["here"] * (1 - self.margin) else "here")

    def summary(self, feeders: int) -> str:
        """One line: what was timed on each side (``feeders``: how many feeder processes) and
        what was kept."""
        kept = f"keeps its {feeders} feeder processes" if self.decided == "feeders" else \
            "runs the route in this process from now on"
        return (f"feeders='auto' {kept}: the loop took {self.paces['feeders'] * 1e3:.2f} ms per batch fed by "
                f"{feeders} feeder processes, {self.paces['here'] * 1e3:.2f} ms fed from this process "
                f"(medians of {self.window} batches each)")
