"""What this host gives a process (:mod:`shardkit.machine`): which process is its job's first here."""

from __future__ import annotations

import pytest

from shardkit.machine import LOCAL_RANK_VARIABLES, first_on_host


@pytest.mark.parametrize(("env", "first"), [
    ({}, True),
    ({"LOCAL_RANK": "0"}, True),
    ({"LOCAL_RANK": "1"}, False),
    ({"LOCAL_RANK": "00"}, True),
    ({"SLURM_LOCALID": "3"}, False),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, True),
    ({"LOCAL_RANK": "0", "SLURM_LOCALID": "5"}, True),  # torchrun inside srun: torchrun's own rank
    ({"LOCAL_RANK": "2", "SLURM_LOCALID": "0"}, False),
    ({"LOCAL_RANK": "", "SLURM_LOCALID": "1"}, False),  # an empty one is not set
    ({"LOCAL_RANK": "x"}, True),  # not an integer: the work done once per host is done, not skipped
])
def test_the_first_process_on_a_host_is_told_by_the_launchers_variables(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], first: bool) -> None:
    for name in LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert first_on_host() is first
