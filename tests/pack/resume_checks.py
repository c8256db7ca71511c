"""What the resume tests run and check: the pack command, and that a destination holds only
complete files."""

from __future__ import annotations

import sys
from pathlib import Path

MAX_COUNT = 6


def arguments(src, dst, *extra) -> list[str]:
    return ["pack", str(src), str(dst), "--max-count", str(MAX_COUNT), "--workers", "2", "--quiet", *extra]


def command(src, dst, *extra) -> list[str]:
    return [sys.executable, "-m", "shardkit", *arguments(src, dst, *extra)]


def visible(dst: Path) -> dict[str, bytes]:
    return ({p.name: p.read_bytes() for p in dst.iterdir() if not p.name.startswith(".")}
            if dst.exists() else {})


def check_only_complete_files(dst: Path, reference: dict[str, bytes]) -> int:
    """Every visible file is byte-identical to the finished run's; others are hidden temporaries."""
    shown = visible(dst)
    for name, data in shown.items():
        assert data == reference[name], f"{name} is visible but not complete"
    hidden = [p.name for p in dst.iterdir() if p.name.startswith(".")] if dst.exists() else []
    assert all(h == ".shardkit-pack" or ".tmp-" in h for h in hidden), hidden
    return sum(name.endswith(".tar") for name in shown)
