"""Real torch.distributed (gloo) ranks: equal batch counts, every sample covered, no hang."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardkit import ShardLoader, transforms


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, dataset: str, out: str, drop_last: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        loader = ShardLoader(dataset, batch_size=4, transform=transforms.imagenet_train(32), keys=True,
                             num_workers=0, drop_last=drop_last, seed=7)  # rank/world from torch.distributed
        keys: list[str] = []
        steps = 0
        for _, _, batch_keys in loader:
            keys += batch_keys
            steps += 1
            dist.all_reduce(torch.ones(1))  # a collective per step, like DDP: unequal counts would hang
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, {"keys": keys, "steps": steps, "len": len(loader)})
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("world", "drop_last"), [(2, False), (3, True)])
def test_ranks_get_equal_batches_and_cover_the_epoch(packed: Path, tmp_path: Path, world: int, drop_last: bool) -> None:
    out = tmp_path / "result.json"
    mp.start_processes(_rank_main, args=(world, _free_port(), str(packed), str(out), drop_last), nprocs=world,
                       join=True, start_method="spawn")
    results = json.loads(out.read_text())
    steps = {r["steps"] for r in results}
    assert len(steps) == 1 and steps == {results[0]["len"]}
    all_keys = [k for r in results for k in r["keys"]]
    every = {f"{i:08d}" for i in range(69)}
    if drop_last:
        assert len(all_keys) == len(set(all_keys)) and len(every - set(all_keys)) < world * 4
    else:
        assert set(all_keys) == every and len(all_keys) - 69 < world * 4
