"""Real torch.distributed (gloo) ranks: equal batch counts, every sample covered, no hang, and
resume from each rank's state_dict in fresh processes."""

from __future__ import annotations

import hashlib
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


def _signature(batches: object) -> list[tuple[list[str], str]]:
    return [(list(k), hashlib.sha256(x.numpy().tobytes()).hexdigest()) for x, _, k in batches]  # type: ignore[attr-defined]


def _resume_main(rank: int, world: int, port: int, dataset: str, out: str, phase: str, k: int) -> None:
    """Phase "first": the uninterrupted epoch, and a run stopped after ``k`` batches with its
    state; phase "second" (fresh processes): load that state, finish the epoch."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        def make() -> ShardLoader:
            return ShardLoader(dataset, batch_size=4, transform=transforms.imagenet_train(32), keys=True,
                               num_workers=0, seed=7)

        result: dict[str, object] = {}
        if phase == "first":
            full = make()
            full.set_epoch(1)
            result["full"] = _signature(full)
            part = make()
            part.set_epoch(1)
            it = iter(part)
            result["head"] = _signature(next(it) for _ in range(k))
            dist.all_reduce(torch.ones(1))
            result["state"] = part.state_dict()
        else:
            state = json.loads(Path(out).with_name("first.json").read_text())[rank]["state"]
            resumed = make()
            resumed.load_state_dict(state)
            for epoch in range(resumed.epoch, 2):
                resumed.set_epoch(epoch)
                tail = []
                for batch in resumed:
                    tail.append(batch)
                    dist.all_reduce(torch.ones(1))
                result["tail"] = _signature(tail)
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def test_ranks_resume_from_state_dict_in_fresh_processes(packed: Path, tmp_path: Path) -> None:
    world, k = 2, 3
    for phase in ("first", "second"):
        out = str(tmp_path / f"{phase}.json")
        mp.start_processes(_resume_main, args=(world, _free_port(), str(packed), out, phase, k),
                           nprocs=world, join=True, start_method="spawn")
    first = json.loads((tmp_path / "first.json").read_text())
    second = json.loads((tmp_path / "second.json").read_text())
    for rank in range(world):
        full = first[rank]["full"]
        assert len(full) > k and first[rank]["head"] == full[:k]
        assert first[rank]["head"] + second[rank]["tail"] == full
    assert first[0]["full"] != first[1]["full"]
