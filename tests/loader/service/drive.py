"""A training process with a service, run by the cluster tests as a subprocess (a Ray driver of its own).

``python -m tests.loader.service.drive OUT ADDRESS DATASET [options]`` iterates a loader with
``service=RayService(ADDRESS, workers=2)`` and saves what it delivered to OUT (``torch.save``):
``{"batches": [(epoch, images, labels, keys)], "nodes": {node id: batches}, "restarts": n, "killed": ...}``.
A :class:`~shardkit.errors.ShardkitError` is written to OUT as ``{"error": str}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from typing import Any

import torch

from shardkit import RayService, ShardkitError, ShardLoader, transforms
from tests.loader.service.slow import SlowCrop

BATCH, SEED = 8, 3


def loader(dataset: str, slow: bool, **kwargs: Any) -> ShardLoader:
    """The loader every test compares: the service's and the local one differ only in ``kwargs``."""
    transform = SlowCrop() if slow else transforms.imagenet_train(16)
    return ShardLoader(dataset, batch_size=BATCH, transform=transform, seed=SEED, keys=True, **kwargs)


def _kill_node(group: int, worker_pids: list[int]) -> None:
    """SIGKILL process group ``group`` (a node's ``ray start``) and the service workers it started,
    as a machine lost at once: a worker orphaned by its raylet otherwise lives on for up to a
    second, still answering the training process, and may finish every batch it owes."""
    import psutil

    doomed = []
    for pid in worker_pids:
        with contextlib.suppress(psutil.Error, OSError):
            worker = psutil.Process(pid)
            if any(os.getpgid(p.pid) == group for p in [worker, *worker.parents()]):
                doomed.append(pid)
    os.killpg(group, signal.SIGKILL)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("address")
    parser.add_argument("dataset")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--after", type=int, default=2, help="batches delivered before a kill or a stop")
    parser.add_argument("--kill-actor", action="store_true", help="SIGKILL a service worker's process")
    parser.add_argument("--kill-group", default="", help="SIGKILL these process groups (nodes), comma-separated")
    parser.add_argument("--linger", type=float, default=0.0,
                        help="on a ShardkitError mid-epoch: live this many seconds more, then save it")
    parser.add_argument("--stop", default="", help="save the state here, then SIGKILL this process")
    parser.add_argument("--resume", default="", help="load the state saved here first")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    service = RayService(args.address, workers=2, in_flight=4, connect_timeout_s=args.timeout / 6,
                         start_timeout_s=args.timeout, batch_timeout_s=args.timeout)
    try:
        served = loader(args.dataset, args.slow, service=service)
    except ShardkitError as err:
        torch.save({"error": str(err)}, args.out)
        return
    if args.resume:
        with open(args.resume) as f:
            served.load_state_dict(json.load(f))
    assert served.service is not None
    batches: list[Any] = []
    try:
        killed = _iterate(served, args, batches)
    except ShardkitError as err:  # caught by the training loop, as a checkpointing one would
        state = served.state_dict()  # the checkpoint a training loop writes here
        served.close()
        time.sleep(args.linger)
        import ray

        connected = ray.is_initialized()  # before anything else asks Ray: no local cluster was started
        try:  # the loader built again while the cluster is still down
            loader(args.dataset, args.slow, service=service).close()
            again = ""
        except ShardkitError as rebuilt:
            again = str(rebuilt)
        torch.save({"error": str(err), "batches": batches, "state": state, "lingered": args.linger,
                    "connected": connected, "again": again}, args.out)
        return
    torch.save({"batches": batches, "nodes": dict(served.service.nodes), "restarts": served.service.restarts,
                "killed": killed, "workers": [w.pid for w in served.service.workers]}, args.out)
    served.close()


def _iterate(served: ShardLoader, args: argparse.Namespace, batches: list[Any]) -> dict[str, Any]:
    assert served.service is not None
    killed: dict[str, Any] = {}
    for epoch in range(served.epoch, served.epoch + args.epochs):
        served.set_epoch(epoch)
        for images, labels, keys in served:
            batches.append((epoch, images, labels, keys))
            if len(batches) != args.after:
                continue
            if args.stop:
                with open(args.stop, "w") as f:
                    json.dump(served.state_dict(), f)
                os.kill(os.getpid(), signal.SIGKILL)  # the training process dies here
            if args.kill_actor:
                victim = served.service.workers[0]
                killed = {"node": victim.node, "pid": victim.pid}
                os.kill(victim.pid, signal.SIGKILL)
            for group in filter(None, args.kill_group.split(",")):
                _kill_node(int(group), [w.pid for w in served.service.workers])
    return killed


if __name__ == "__main__":
    main()
