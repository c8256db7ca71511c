"""The canaries (shardkit/_canaries.py) of shardkit/_compat.py: every private torch/CPython internal
shardkit uses is still there. A failure names the internal and what to change."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from shardkit import _canaries, _compat

ROOT = Path(__file__).resolve().parents[1]


def test_every_internal_is_still_there() -> None:
    broken = _canaries.broken_internals()
    assert not broken, "private internals gone from this torch/Python:\n" + "\n".join(broken)


def test_a_missing_internal_is_reported_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = _canaries.Canary("torch.no_such_thing", _canaries._has("torch", "no_such_thing"), "do this instead")
    monkeypatch.setattr(_canaries, "CANARIES", (*_canaries.CANARIES[:1], gone))
    broken = _canaries.broken_internals()
    assert len(broken) == 1 and broken[0].startswith("torch.no_such_thing is gone in torch ")
    assert broken[0].endswith(": do this instead")


def test_a_crashing_canary_reports_rather_than_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> bool:
        raise AttributeError("moved")

    monkeypatch.setattr(_canaries, "CANARIES", (_canaries.Canary("x", boom, "fix x"),))
    assert _canaries.broken_internals() == [
        f"x (AttributeError: moved) is gone in torch {torch.__version__} / Python "
        f"{__import__('platform').python_version()}: fix x"]


def test_the_helpers_work() -> None:
    storage = _compat.fd_storage(64)
    fd, nbytes = _compat.fd_storage_descriptor(storage)
    assert nbytes == 64 and _compat.fd_storage_attach(fd, nbytes).nbytes() == 64
    flat = _compat.flatten_dense([torch.arange(4).view(2, 2), torch.arange(2)])
    assert flat.tolist() == [0, 1, 2, 3, 0, 1]
    import sys

    main = sys.modules["__main__"]
    with _compat.hidden_main():
        assert sys.modules["__main__"] is not main
    assert sys.modules["__main__"] is main


PRIVATE_USES = ("_iterator", "_workers", "_set_SIGCHLD_handler", "_BaseDataLoaderIter", "_new_using_fd_cpu",
                "_share_fd_cpu_", "_new_shared_fd_cpu", "_flatten_dense_tensors", "_registry", "_after_fork",
                "_processes", "_executor_manager_thread", "_shutdown_workers", "_add_dataloader",
                "_remove_dataloader", "_shared_state", "_call_queue", "_result_queue", "_finalizer_registry",
                "_semlock")


def test_no_module_but_compat_touches_those_internals() -> None:
    """The attributes above are named (as attributes or strings) in shardkit/_compat.py and its
    canaries only."""
    offenders = []
    for path in sorted((ROOT / "shardkit").rglob("*.py")):
        if path.name in ("_compat.py", "_canaries.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else \
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else \
                node.name if isinstance(node, ast.alias) else None
            if name in PRIVATE_USES or (isinstance(name, str) and name.split(".")[-1] in PRIVATE_USES):
                offenders.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {name}")
    assert not offenders, "private internals used outside shardkit/_compat.py:\n" + "\n".join(offenders)
