"""The runs a training bench has finished, kept when it is stopped part-way.

A training bench runs every contender ``repeats`` times, one run after another, often for many
minutes; Ctrl-C or a SIGTERM (``timeout``, a scheduler preempting the job) stops it in the
middle. The runs it finished by then are measurements like those of a bench that ran to its
end, and the ones that cost the time: :class:`FinishedRuns` records each as it ends, and when
the bench is interrupted raises :class:`Interrupted`, which carries the report of those runs,
marked ``interrupted``, for the caller to print and save.

Every contender runs once a repetition, repetitions one after another, so however the bench
stops, a contender's i-th run is repetition i's: the ratios taken "in the same repetition"
pair runs by position, over the repetitions both sides finished
(:func:`~shardkit.bench.train_report.against_best_dali`). A contender with no finished run has
no row; the mark names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from shardkit.bench.isolate import RunLost
from shardkit.errors import interrupt_behind

__all__ = ["FinishedRuns", "Interrupted", "interrupted_note"]


class Interrupted(KeyboardInterrupt):
    """A bench stopped part-way by ``interrupt`` (the KeyboardInterrupt that Ctrl-C or a
    SIGTERM raised), its run in progress stopped and dropped. ``report``: the report of the runs
    it finished (its ``interrupted`` entry says how many of how many), or None where it finished
    none. A KeyboardInterrupt still, for a caller that does not look for the report."""

    def __init__(self, interrupt: KeyboardInterrupt, report: dict[str, Any] | None) -> None:
        super().__init__(interrupt, report)  # both: it pickles
        self.interrupt = interrupt
        self.report = report

    def __str__(self) -> str:
        if self.report is None:
            return "stopped before a run finished"
        mark = self.report["interrupted"]
        return f"stopped after {mark['runs_finished']} of {mark['runs_planned']} runs"


#: A run's result: a training bench's ``TrainRun``, a loader bench's ``RunResult``.
R = TypeVar("R")


class FinishedRuns(Generic[R]):
    """Each contender's runs in the order they finish, for a bench of ``repeats`` repetitions of
    the contenders ``names``; ``after_run(name, repetition, run)`` follows each, once it is kept.

    Example::

        finished = FinishedRuns(contenders, cfg.repeats, after_run)
        with finished.kept(lambda runs, mark: report(runs, mark)):
            for rep, names in enumerate(alternating_order(list(contenders), cfg.repeats)):
                for name in names:
                    finished.add(name, rep, run(name))
        return report(finished.runs, None)
    """

    def __init__(self, names: Iterable[str], repeats: int,
                 after_run: Callable[[str, int, R], None] | None = None) -> None:
        self.runs: dict[str, list[R]] = {name: [] for name in names}
        self.planned = len(self.runs) * repeats
        self._after_run = after_run

    def add(self, name: str, rep: int, run: R) -> None:
        """Keep ``run``, repetition ``rep`` of contender ``name``, then call ``after_run``."""
        self.runs[name].append(run)
        if self._after_run is not None:
            self._after_run(name, rep, run)

    def mark(self) -> dict[str, Any]:
        """The report's ``interrupted`` entry: runs finished, runs planned, and the contenders that
        finished none (left out of the rows)."""
        return {"runs_finished": sum(map(len, self.runs.values())), "runs_planned": self.planned,
                "not_run": [name for name, runs in self.runs.items() if not runs]}

    def finished(self) -> dict[str, list[R]]:
        """The contenders that finished a run, with their runs."""
        return {name: runs for name, runs in self.runs.items() if runs}

    @contextlib.contextmanager
    def kept(self, report: Callable[[dict[str, list[R]], dict[str, Any]], dict[str, Any]]
             ) -> Iterator[None]:
        """The block runs the bench: a KeyboardInterrupt in it becomes :class:`Interrupted`, with
        ``report(runs, mark)`` of the runs finished by then (the contenders without one left out of
        ``runs``), or no report where none finished. A run lost on the way
        (:class:`~shardkit.bench.isolate.RunLost`) ends the bench all the same, its ``report`` that
        of the runs before it, its mark saying which run was lost and how (``lost``)."""
        try:
            yield
        except Interrupted:
            raise
        except KeyboardInterrupt as interrupt:
            finished = self.finished()
            raise Interrupted(interrupt, report(finished, self.mark()) if finished else None) from interrupt
        except RunLost as lost:  # the bench ends with it, and keeps what it measured before
            finished = self.finished()
            lost.report = report(finished, {**self.mark(), "lost": str(lost)}) if finished else None
            raise
        except Exception as err:
            # raised while an interruption unwound: torch's "DataLoader worker ... is killed by signal",
            # a SIGTERM sent to the whole process group having stopped the run's workers too
            behind = interrupt_behind(err)
            if not isinstance(behind, KeyboardInterrupt):
                raise
            finished = self.finished()
            raise Interrupted(behind, report(finished, self.mark()) if finished else None) from behind


def interrupted_note(mark: Mapping[str, Any]) -> str:
    """The line under the title of a bench stopped part-way, interrupted or by a lost run (``mark``:
    its report's ``interrupted``, see :mod:`shardkit.bench.finished`), naming the contenders it left
    without a row.

    Example:
        >>> interrupted_note({"runs_finished": 5, "runs_planned": 6, "not_run": []})
        'interrupted after 5 of 6 runs: the table holds the finished runs'
        >>> interrupted_note({"runs_finished": 1, "runs_planned": 6, "not_run": ["dali", "imagefolder"]})
        'interrupted after 1 of 6 runs: the table holds the finished runs (not run: dali, imagefolder)'
        >>> interrupted_note({"runs_finished": 2, "runs_planned": 6, "not_run": [], "lost": "the run of dali died"})
        'stopped by a lost run after 2 of 6 runs: the table holds the finished runs'
        >>> interrupted_note({"runs_finished": 4, "runs_planned": 4, "not_run": []})
        'interrupted after all 4 runs, while their GPU times were taken: the table holds every run, without GPU times'
    """
    if mark["runs_finished"] >= mark["runs_planned"] and not mark.get("lost"):  # in what follows: GPU times
        return (f"interrupted after all {mark['runs_planned']} runs, while their GPU times were taken: the table "
                "holds every run, without GPU times")
    not_run = f" (not run: {', '.join(mark['not_run'])})" if mark.get("not_run") else ""
    how = "stopped by a lost run" if mark.get("lost") else "interrupted"
    return (f"{how} after {mark['runs_finished']} of {mark['runs_planned']} runs: the table holds the "
            f"finished runs{not_run}")
