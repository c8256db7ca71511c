"""Real torch.distributed (gloo) ranks: equal batch counts, every sample covered, no hang, and
resume from each rank's state_dict in fresh processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardkit import ShardLoader, transforms
from tests.conftest import upload_tree
from tests.ports import free_port
from tests.ranks import gloo, write_gathered

ROOT = Path(__file__).resolve().parents[2]


def _rank_main(rank: int, world: int, port: int, dataset: str, out: str, drop_last: bool) -> None:
    with gloo(rank, world, port):
        loader = ShardLoader(dataset, batch_size=4, transform=transforms.imagenet_train(32), keys=True,
                             num_workers=0, drop_last=drop_last, seed=7)  # rank/world from torch.distributed
        keys: list[str] = []
        steps = 0
        for _, _, batch_keys in loader:
            keys += batch_keys
            steps += 1
            dist.all_reduce(torch.ones(1))  # a collective per step, like DDP: unequal counts would hang
        write_gathered(out, {"keys": keys, "steps": steps, "len": len(loader)})


@pytest.mark.parametrize(("world", "drop_last"), [(2, False), (3, True)])
def test_ranks_get_equal_batches_and_cover_the_epoch(packed: Path, tmp_path: Path, world: int, drop_last: bool) -> None:
    out = tmp_path / "result.json"
    mp.start_processes(_rank_main, args=(world, free_port(), str(packed), str(out), drop_last), nprocs=world,
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
    with gloo(rank, world, port):
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
        write_gathered(out, result)


def test_ranks_resume_from_state_dict_in_fresh_processes(packed: Path, tmp_path: Path) -> None:
    world, k = 2, 3
    for phase in ("first", "second"):
        out = str(tmp_path / f"{phase}.json")
        mp.start_processes(_resume_main, args=(world, free_port(), str(packed), out, phase, k),
                           nprocs=world, join=True, start_method="spawn")
    first = json.loads((tmp_path / "first.json").read_text())
    second = json.loads((tmp_path / "second.json").read_text())
    for rank in range(world):
        full = first[rank]["full"]
        assert len(full) > k and first[rank]["head"] == full[:k]
        assert first[rank]["head"] + second[rank]["tail"] == full
    assert first[0]["full"] != first[1]["full"]


# One rank of a torchrun job over a mix of an S3 dataset and a local one: epoch 1 whole, then
# the same epoch stopped after K batches, its state through JSON, and a fresh loader resuming it.
MIX_RANK = """
import hashlib, json, sys
import torch, torch.distributed as dist
from shardkit import ShardLoader, transforms

datasets, options, cache, out, k = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], 3
dist.init_process_group("gloo")

def make():
    return ShardLoader(datasets, weights=[2, 1], batch_size=4, transform=transforms.imagenet_train(32), keys=True,
                       seed=7, storage_options=options, cache_dir=cache)

def signature(batches):
    return [(list(keys), hashlib.sha256(x.numpy().tobytes()).hexdigest()) for x, _, keys in batches]

full = make()
full.set_epoch(1)
whole = signature(full)
part = make()
part.set_epoch(1)
it = iter(part)
head = signature(next(it) for _ in range(k))
state = json.loads(json.dumps(part.state_dict()))
resumed = make()
resumed.load_state_dict(state)
resumed.set_epoch(1)
tail = []
for batch in resumed:
    tail += signature([batch])
    dist.all_reduce(torch.ones(1))  # a collective per step: unequal counts would hang
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, {"whole": whole, "head": head, "tail": tail, "len": len(full)})
if dist.get_rank() == 0:
    open(out, "w").write(json.dumps(gathered))
dist.destroy_process_group()
"""


def test_torchrun_ranks_mix_a_remote_and_a_local_dataset_and_resume(packed: Path, s3_server: dict[str, object],
                                                                    s3_bucket: str, tmp_path: Path) -> None:
    url = f"{s3_bucket}/ds"
    upload_tree(packed, url, s3_server)
    script, out = tmp_path / "rank.py", tmp_path / "out.json"
    script.write_text(MIX_RANK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max_restarts",
           "0", str(script), json.dumps([url, str(packed)]), json.dumps(s3_server), str(tmp_path / "cache"), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(out.read_text())
    for rank in ranks:
        assert len(rank["whole"]) == rank["len"] > 3 and rank["head"] + rank["tail"] == rank["whole"]
    keys = [k for rank in ranks for keys, _ in rank["whole"] for k in keys]
    assert len(keys) - 2 * 69 < 2 * 4 and set(keys) == {f"{i:08d}" for i in range(69)}  # 69 samples twice, padded
    assert len(list((tmp_path / "cache").glob("*.table"))) == 1  # the S3 dataset's table, once for the node
