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
    each side so far (:attr:`paces`), and once both are timed, the side kept (:attr:`decided`).

    A side whose window does not fill within :attr:`limit` requests (a loop that takes one batch
    per epoch has no interval to time) is judged on the intervals it has; a side with none is
    not timed, and without both sides timed the feeders stay, as before there was a trial."""

    skip: int = SKIP
    window: int = WINDOW
    margin: float = MARGIN
    place: Place = "feeders"
    paces: dict[str, float] = field(default_factory=dict)
    decided: Place | None = None
    _skip_left: int = 0  # intervals still to leave untimed on this side
    _requests: int = 0  # requests on this side
    _intervals: list[float] = field(default_factory=list)
    _last: float | None = None

    def __post_init__(self) -> None:
        self._skip_left = self.skip

    @property
    def limit(self) -> int:
        """Requests on one side after which it is judged on the intervals it has."""
        return 4 * (self.skip + self.window)

    def restart_clock(self) -> None:
        """The loop's next request does not end an interval (a new iteration's first: the time
        between epochs is the loop's own)."""
        self._last = None

    def opened(self) -> None:
        """The side's delivery was opened again (a new epoch, feeders restarted): the interval
        that takes its first batch is not timed (after a switch, :attr:`skip` are not)."""
        self._skip_left = max(self._skip_left, 1)

    def request(self, now: float) -> None:
        """The loop asks for its next batch at ``now`` (a monotonic clock's seconds): time the
        interval since its last request, and move on to the other side (or decide) once this
        side's window is full."""
        if self.decided is not None:
            return
        if self._last is not None:
            if self._skip_left > 0:
                self._skip_left -= 1
            else:
                self._intervals.append(now - self._last)
        self._last, self._requests = now, self._requests + 1
        if len(self._intervals) < self.window and self._requests < self.limit:
            return
        if self._intervals:
            self.paces[self.place] = statistics.median(self._intervals)
        self._intervals, self._requests, self._skip_left = [], 0, self.skip
        if self.place == "feeders" and "here" not in self.paces:
            self.place = "here"
            return
        feeders, here = self.paces.get("feeders"), self.paces.get("here")
        self.decided = self.place = (
            "feeders" if feeders is None or here is None or feeders < here * (1 - self.margin) else "here")

    def summary(self, feeders: int) -> str:
        """One line: what was timed on each side (``feeders``: how many feeder processes) and
        what was kept."""
        kept = f"keeps its {feeders} feeder processes" if self.decided == "feeders" else \
            "runs the route in this process from now on"

        def pace(side: str) -> str:
            return f"{self.paces[side] * 1e3:.2f} ms per batch" if side in self.paces else "not timed"

        return (f"feeders='auto' {kept}: the loop took {pace('feeders')} fed by {feeders} feeder processes, "
                f"{pace('here')} fed from this process (medians of up to {self.window} batches each)")
