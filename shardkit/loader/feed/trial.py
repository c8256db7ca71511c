"""``feeders="auto"`` once its feeders run: time the training loop fed by them and fed by the
route in this process, and keep the faster.

Why: whether feeders help depends on the step, not only on the machine. Measured on an H200
(docs/performance.md, "Feeders against none"), three feeders fed a compiled ResNet-18 step at
batch 128 1.20x faster than the route in the training process (the step was host-bound, and the
feeders took the route's host work out of its interpreter), but at batch 256 0.947x as fast (the
step was bound by the GPU, where the feeders' decode kernels take turns with the step's: each
process has a CUDA context of its own). Only the loop itself can tell.

**How.** The loop's pace is the time between its requests for batches (its whole iteration:
step, logging, the wait for the batch), each interval counted for the batch the loop had just
taken. The loader's batches, counted over its life, fall into *phases* of :data:`SKIP` +
:data:`WINDOW` batches, given to the feeders and to the route in this process in turn (even
phases to the feeders). A phase is timed when the feeders were up at its first batch; its
intervals count from the batch after the first :data:`SKIP` since the side last changed, less
the two around each epoch boundary (the last batch's interval holds the time between epochs,
the loop's own; the first batch comes from a delivery opened anew). Each side's intervals are
pooled over its timed phases; once both sides have half a window, the feeders stay only if
their median is at least :data:`MARGIN` shorter (on a tie the route stays here: fewer
processes, less CPU). Where the two medians fall within :data:`BAND` of that margin, one phase of
each is not enough to tell them apart from a machine's noise, and one more phase of each is
timed first: the decision then rests on the pooled medians. Where that never comes (a loop that
takes one batch per iteration has no interval to time), the feeders stay after :data:`PHASES`
timed phases.

**Which clock.** On a CUDA device each request is stamped on the device's timeline
(:class:`DeviceStamp`: an event on the current stream, reached once the steps queued before it
are done), not by the host's clock. The host runs steps ahead of the GPU until the launch queue
fills, and how far ahead depends on the side, so a phase timed by the host's clock can show a
pace the step cannot have. Measured on an H200 (ResNet-18 @176, batch 256, docs/performance.md),
the host's clock gave the feeders 9.5 and 12.4 ms per batch, for a step of 10.9 ms on the
device, which the feeders fed every 20.6 ms in steady state; the trial kept them, where the
route in this process fed the step 1.25x as fast. The device's timeline counts what the step
gets: its kernels, and its waits for each batch.

**Ranks.** Phases are fixed by batch number, not by when the feeders came up: while every rank's
feeders are up and no rank has decided, ranks that step together (DDP) are fed from the same
side at every batch, so a rank does not time one side while another, which its step waits for,
is fed from the other. A rank whose feeders came up late, or whose first two phases fell within
the band, times phases while an earlier rank may already have decided, and each rank decides on
what it timed: ranks can keep different sides (the batches are the same either way).

The batches are the same either way; only where they are made changes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = ["BAND", "MARGIN", "PHASES", "SKIP", "WINDOW", "DeviceStamp", "PaceTrial", "Place", "Stamp"]

#: Batches after a switch whose intervals are not timed (the new side filling its pipeline).
SKIP = 8
#: Intervals timed in a phase (after the skipped ones).
WINDOW = 24
#: How much shorter the feeders' median interval must be for them to stay. Chosen from the trials
#: measured on H100 hosts (ResNet-18 @176, batch 128, docs/performance.md): three feeders timed
#: 4.3–14.6% shorter were kept and then fed the step 0.79–0.91x as fast as the route without
#: feeders (the trial's pace for the feeders 14–24% shorter than their steady one, for this
#: process up to 12% longer; why is not known); on an H200 at batch 256, timed 21–22% shorter,
#: they were a real 1.29x.
MARGIN = 0.15
#: How near the margin the first phase of each side may put the feeders' gain (the share by which
#: their median is shorter) before one more phase of each is timed. On one H100 host six trials of
#: the same ResNet-18 step (batch 128) timed the feeders 21–27% shorter in five and 14.2% in the
#: sixth, which then kept the route, 0.92x the feeders in use (docs/performance.md).
BAND = 0.05
#: Phases timed (feeders up) after which a trial that still lacks a side ends keeping the feeders
#: (a loop that takes one batch per iteration leaves no interval to time).
PHASES = 6

#: Where the route runs: in the feeder processes, or in this one.
Place = Literal["feeders", "here"]


class DeviceStamp:
    """A point on a CUDA device's timeline: an event recorded on ``stream`` (the device's current
    stream by default) when the loop asks for a batch, which the device reaches once all the work
    queued before it is done. ``later - earlier`` is the seconds between the two on the device;
    it waits for both to be reached (the trial asks once per phase)."""

    __slots__ = ("event",)

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None = None) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record(stream if stream is not None else torch.cuda.current_stream(device))

    def __sub__(self, earlier: DeviceStamp) -> float:
        earlier.event.synchronize()  # on another stream (a loop that changed streams) it may come later
        self.event.synchronize()
        return earlier.event.elapsed_time(self.event) / 1e3


#: When the loop asked for a batch: the host's monotonic clock in seconds, or a device stamp.
Stamp = float | DeviceStamp


def _seconds(start: Stamp, end: Stamp) -> float:
    """The seconds from ``start`` to ``end``: two host times, or two device stamps."""
    if isinstance(start, DeviceStamp) and isinstance(end, DeviceStamp):
        return end - start
    if isinstance(start, DeviceStamp) or isinstance(end, DeviceStamp):
        raise TypeError("a trial's stamps are all host times or all device stamps")
    return end - start


@dataclass
class PaceTrial:
    """The trial's state: the median interval timed on each side so far (:attr:`paces`, seconds
    per batch), and once both are timed, the side kept (:attr:`decided`). :meth:`place` says
    which side delivers a batch, by its number."""

    skip: int = SKIP
    window: int = WINDOW
    margin: float = MARGIN
    band: float = BAND
    phases: int = PHASES
    paces: dict[str, float] = field(default_factory=dict)
    decided: Place | None = None
    _phase: int = -1  # the phase of the last batch asked for
    _timed: bool = False  # whether that phase is timed (the feeders were up at its first batch)
    _timed_phases: int = 0
    _again: list[str] | None = None  # once the medians fell within the band: the sides timed again since
    _intervals: list[tuple[Stamp, Stamp]] = field(default_factory=list)  # the phase's, as (from, to)
    _pooled: dict[str, list[float]] = field(default_factory=dict)  # each side's, over its timed phases
    _last: Stamp | None = None  # when the loop last asked for a batch, in this iteration
    _counts: bool = False  # whether the interval from then on is one of the phase's

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a pickled loader) keeps what was timed, not the phase under way (device stamps
        # do not travel): its next request starts the interval anew
        return {**self.__dict__, "_last": None, "_counts": False, "_intervals": []}

    @property
    def length(self) -> int:
        """Batches in a phase."""
        return self.skip + self.window

    def place(self, n: int) -> Place:
        """The side that delivers the loader's ``n``-th batch (counted from 0 over its life) while
        its feeders are up."""
        return self.decided if self.decided is not None else self._side_of(n // self.length)

    @staticmethod
    def _side_of(phase: int) -> Place:
        """The side a phase is given to: even phases to the feeders."""
        return "feeders" if phase % 2 == 0 else "here"

    def restart_clock(self) -> None:
        """A new iteration: the interval up to its first request is the loop's own."""
        self._last, self._counts = None, False

    def request(self, now: Stamp, n: int, *, up: bool) -> None:
        """The loop asks at ``now`` (a monotonic clock's seconds, or a :class:`DeviceStamp`;
        one kind throughout) for batch ``n``, the feeders
        ``up`` or not: the interval since its last request is timed if it counts; a phase that
        ends is judged, and the trial decided once both sides are timed."""
        if self.decided is not None:
            return
        if self._counts and self._last is not None:
            self._intervals.append((self._last, now))
        self._last, self._counts = now, False
        phase = n // self.length
        if phase == self._phase:
            return
        if self._timed:
            self._judge()
        self._phase, self._timed, self._intervals = phase, up, []

    def fetching(self, n: int, side: Place, *, since_switch: int, fresh: bool) -> None:
        """Batch ``n`` comes from ``side``, the ``since_switch``-th since the side last changed
        (0: the first), ``fresh``: the first of a delivery just opened; the interval that
        follows counts if the phase is timed and the batch is its side's, past the skipped ones."""
        self._counts = self._timed and side == self.place(n) and since_switch >= self.skip and not fresh

    def _judge(self) -> None:
        """The timed phase just ended: its intervals join its side's; a side with half a window
        of them has a median; the decision once both have, where their medians fall within
        :attr:`band` of the margin once each side has added a timed phase more, or after
        :attr:`phases` timed phases."""
        self._timed_phases += 1
        side = self._side_of(self._phase)
        pooled = self._pooled.setdefault(side, [])
        added = [_seconds(start, end) for start, end in self._intervals]
        pooled += added
        if len(pooled) >= max(1, self.window // 2):
            self.paces[side] = statistics.median(pooled)
        feeders, here = self.paces.get("feeders"), self.paces.get("here")
        if feeders is None or here is None:
            if self._timed_phases >= self.phases:
                self.decided = "feeders"
        else:
            if self._again is None:
                if abs(here * (1 - self.margin) - feeders) < self.band * here:
                    self._again = []  # too near to tell: a phase more of each side first
            elif added and side not in self._again:
                self._again.append(side)
            if self._again is None or len(self._again) == 2 or self._timed_phases >= self.phases:
                self.decided = "feeders" if feeders <= here * (1 - self.margin) else "here"
        if self.decided is not None:
            self._last, self._counts = None, False  # nothing more is timed

    def summary(self, feeders: int) -> str:
        """One line: what was timed on each side (``feeders``: how many feeder processes) and
        what was kept."""
        kept = f"keeps its {feeders} feeder processes" if self.decided == "feeders" else \
            "runs the route in this process from now on"

        def pace(side: str) -> str:
            if side not in self.paces:
                return "not timed"
            return f"{self.paces[side] * 1e3:.2f} ms per batch (median of {len(self._pooled[side])})"

        return (f"feeders='auto' {kept}: the loop took {pace('feeders')} fed by {feeders} feeder processes, "
                f"{pace('here')} fed from this process")
