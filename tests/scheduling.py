"""pytest-xdist's ``--dist loadfile`` scheduler, with its handling of a crashed worker corrected.

When a worker dies (a segfault, a test that kills its own process), pytest-xdist 3.8 reports the
test it was running as failed and starts a replacement worker, but it puts back on the queue every
file the dead worker had been given, finished ones included, and the test that crashed as not run.
The finished files become empty work units; a worker sent one never asks for more, and once the
other workers have nothing left to finish, the session waits for ever at the end of the run (see
pytest-xdist's issues 1323 and 1378, fixed on its main branch after 3.8.0). The crashed test went
to the replacement, which it could crash again. Here, only the tests not run yet go back, the
crashed one counted as done (it is reported as failed already): a crash costs one failure, and
the run ends with every other test run.

Two more ways such a run hung or broke: a worker runs a test only once it holds the next one or
has been told to stop, and a replacement given a file of one test, with more files queued, was
sent neither (issue 1327): a worker is now given files until it holds three tests, and told to stop
once none is left. And a file sent to a worker that had died a moment before ended the session
with an INTERNALERROR ("cannot send"): the file is recorded against that worker before the send,
so its death, reported next, puts it back on the queue. A replacement that has not collected
yet (a second crash meanwhile) is given nothing until it has: its files could not be named.
"""

from __future__ import annotations

import contextlib

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController


class CrashSafeLoadFileScheduling(LoadFileScheduling):
    def remove_node(self, node: WorkerController) -> str | None:
        workload = self.assigned_work.pop(node)
        pending = [unit for unit in workload.values() if not all(unit.values())]
        if not pending:
            return None
        crashed = next(nodeid for nodeid, done in pending[0].items() if not done)
        pending[0][crashed] = True  # the worker runs its units in order: it died in this test
        self.workqueue.update((scope, unit) for scope, unit in workload.items() if not all(unit.values()))
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down or node not in self.registered_collections:
            return  # a replacement still collecting: schedule() supplies it once it has
        while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)
        if not self.workqueue:
            node.shutdown()  # it runs what it holds, its last test included, then stops

    def _assign_work_unit(self, node: WorkerController) -> None:
        with contextlib.suppress(OSError):  # the worker died a moment ago: remove_node puts this file back
            super()._assign_work_unit(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    if config.getvalue("dist") == "loadfile":
        return CrashSafeLoadFileScheduling(config, log)
    return None  # pytest-xdist's own
