"""Real torch.distributed (gloo) ranks in tests: a rank's process group, and the
ranks' results gathered to a JSON file that the test reads."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist


@contextlib.contextmanager
def gloo(rank: int, world: int, port: int) -> Iterator[None]:
    """This process as ``rank`` of ``world`` gloo ranks meeting on ``port``, for the block."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def write_gathered(out: str | Path, value: object) -> None:
    """Gather ``value`` from every rank; rank 0 writes the list, by rank, as JSON to ``out``."""
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(gathered))
