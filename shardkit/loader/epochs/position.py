"""Where a loader stands: the epoch, the next batch of it, and how the next iteration starts."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.loader.epochs.remainder import Remainder

__all__ = ["Position"]


@dataclass
class Position:
    """The next batch to deliver is batch ``batch`` of ``epoch`` (of what ``remainder`` leaves of
    it after an elastic resume; None: all of it).

    ``fresh``: the position was set as a starting point (a new loader, :meth:`set_epoch`,
    :meth:`resumed`, an epoch finished); otherwise an iteration was left mid-epoch and the next one
    starts the following epoch, as a ``DataLoader`` does. ``loaded``: the position came from a
    resume state and nothing ran since (``set_epoch`` of that epoch keeps it). ``following``: the
    epoch :meth:`set_epoch` gave, or the point :meth:`resumed` gave, while an iteration was open,
    where the next one starts (as a ``DistributedSampler`` whose ``set_epoch`` is called
    mid-iteration, or torchdata's ``StatefulDataLoader`` loading a state then).

    Example:
        >>> p = Position()
        >>> p.begin(), p.delivered(0, 3), p.begin()  # left mid-epoch: the next iteration runs epoch 1
        ((0, 0, None), None, (1, 0, None))
        >>> p.resumed(4, 7, None); p.set_epoch(4); p.begin()  # set_epoch keeps a resume point
        (4, 7, None)
        >>> p.set_epoch(9, iterating=True); p.delivered(4, 8); p.place  # set mid-iteration: not yet recorded
        (4, 8, None)
        >>> p.finished(4); p.begin()  # the next iteration runs it
        (9, 0, None)
    """

    epoch: int = 0
    batch: int = 0
    fresh: bool = True
    loaded: bool = False
    remainder: Remainder | None = None
    following: _Following | None = None

    def set_epoch(self, epoch: int, *, iterating: bool = False, midway: bool = False
                  ) -> tuple[int, int, Remainder | None] | None:
        """The next iteration runs ``epoch`` from its start (right after :meth:`resumed` into that
        epoch: from the resume point). ``iterating``: an iteration is open; it goes on with its
        own epoch, and ``epoch`` applies once it ends (:meth:`ended`) or the next one begins;
        ``midway``: that iteration has batches still to deliver, and then its own epoch, with
        nothing else given meanwhile, changes nothing (a loop saying which epoch it is in; the
        next iteration runs the epoch after it).

        Returns the resume point ``(epoch, batch, remainder)`` this drops: one :meth:`resumed` gave,
        of another epoch, that nothing ran from yet (a loop counting its epochs from 0 after a
        resume); else None.
        """
        if iterating:
            f = self.following
            if f is not None and f.resume and f.epoch == epoch:
                return None  # right after a state loaded meanwhile: keeps its resume point, as below
            if f is None and midway and epoch == self.epoch:
                return None
            self.following = _Following(epoch)
            return (f.epoch, f.batch, f.remainder) if f is not None and f.resume else None
        self.following = None
        if self.loaded and epoch == self.epoch:
            return None
        dropped = (self.epoch, self.batch, self.remainder) if self.loaded else None
        self.epoch, self.batch, self.fresh, self.loaded, self.remainder = epoch, 0, True, False, None
        return dropped

    @property
    def place(self) -> tuple[int, int, Remainder | None]:
        """``(epoch, batch, remainder)`` a checkpoint records: a state loaded while an iteration is
        open (where the next one starts), else where the loader stands: an epoch set while one is
        open is not recorded until it ends, so a checkpoint taken meanwhile resumes the batches
        still to come of the open one."""
        f = self.following
        if f is not None and f.resume:
            return f.epoch, f.batch, f.remainder
        return self.epoch, self.batch, self.remainder

    def ended(self) -> None:
        """The open iteration ended (whole, see :meth:`finished`, or left): an epoch set or a state
        loaded meanwhile is the next iteration's."""
        following, self.following = self.following, None
        if following is not None and following.resume:
            self.resumed(following.epoch, following.batch, following.remainder)
        elif following is not None:
            self.set_epoch(following.epoch)

    def begin(self) -> tuple[int, int, Remainder | None]:
        """An iteration starts: ``(epoch, first batch, remainder)`` it runs."""
        self.ended()  # an older iteration still open, or never ended
        if not self.fresh:
            self.epoch, self.batch, self.remainder = self.epoch + 1, 0, None
        self.fresh = self.loaded = False
        return self.epoch, self.batch, self.remainder

    def delivered(self, epoch: int, batches: int) -> None:
        """``batches`` of ``epoch`` have been delivered."""
        self.epoch, self.batch = epoch, batches

    def finished(self, epoch: int) -> None:
        """``epoch`` was delivered whole: the next iteration runs the following one (or the one
        set meanwhile)."""
        self.epoch, self.batch, self.fresh, self.remainder = epoch + 1, 0, True, None
        self.ended()

    def resumed(self, epoch: int, batch: int, remainder: Remainder | None, *, iterating: bool = False) -> None:
        """Set from a resume state (see :meth:`~shardkit.loader.epochs.config.PlanConfig.resume`);
        ``iterating``: as for :meth:`set_epoch`, once the open iteration ends."""
        if iterating:
            self.following = _Following(epoch, batch, remainder, resume=True)
            return
        self.following = None
        self.epoch, self.batch, self.remainder = epoch, batch, remainder
        self.fresh = self.loaded = True


@dataclass(frozen=True)
class _Following:
    """Where the next iteration starts, given while one was open: an epoch from its start, or a
    resume point (``resume``)."""

    epoch: int
    batch: int = 0
    remainder: Remainder | None = None
    resume: bool = False
