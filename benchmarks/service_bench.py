"""A training process short of cores, fed by a preprocessing service on the host's other cores.

Three ways to feed the same loop (``ShardLoader`` on the CPU route, ``transforms.imagenet_train``,
the same seed), each in a fresh process, runs alternating:

- ``pinned-local``: the training process pinned to ``--trainer-cores`` cores
  (``os.sched_setaffinity``), with ``--trainer-cores`` local workers (which inherit the pinning);
- ``pinned-service``: the same pinned process with ``service=RayService(...)``: the workers are Ray
  actors on a local Ray node pinned to the host's other cores (``shardkit serve --head``, started
  here), or on the cluster at ``--address``;
- ``local-N``: ``--local-workers`` local workers, nothing pinned.

Each run times ``--epochs`` epochs from the first batch (worker start-up excluded) and reports
images/s; the table gives the median and the spread (min-max) over ``--repeats``. The service's
first ``--check`` batches are compared tensor by tensor with those of local workers.

    python -m benchmarks.service_bench --images 20000 --repeats 5

Needs Ray (``pip install 'shardkit[ray]'``). On a 16-core host the defaults give the trainer
2 cores, the service 14, and 16 unpinned local workers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def dataset(root: Path, images: int, workers: int) -> Path:
    """An ImageNet-like packed dataset of about ``images`` images under ``root`` (made once)."""
    from sample_data.generate import make_imagenet_like
    from shardkit.pack import PackOptions, pack

    packed = root / f"shards-{images}"
    if (packed / "index.json").exists():
        return packed
    classes = 10
    make_imagenet_like(root / f"src-{images}", classes=classes, per_class=max(1, images // classes),
                       workers=workers)
    pack(str(root / f"src-{images}"), str(packed), options=PackOptions(max_count=200), workers=workers)
    return packed


def child(args: argparse.Namespace) -> None:
    """One timed run (in its own process): print ``{"images_per_s": ..., "equal": ...}``."""
    import torch

    from shardkit import RayService, ShardLoader, transforms

    if args.pin:
        os.sched_setaffinity(0, [int(c) for c in args.pin.split(",")])
    common: dict[str, Any] = dict(batch_size=args.batch, transform=transforms.imagenet_train(args.size),
                                  seed=args.seed)
    service = None
    if args.condition == "service":
        service = RayService(args.address, workers=args.service_workers)
        loader = ShardLoader(args.dataset, service=service, **common)
    else:
        loader = ShardLoader(args.dataset, num_workers=args.workers, **common)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    images, start = 0, 0.0
    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch, labels in loader:
                if not start:
                    start = time.perf_counter()  # from the first batch: start-up is not throughput
                else:
                    images += len(labels)
                if epoch == 0 and len(kept) < args.check:
                    kept.append((batch, labels))
        seconds = time.perf_counter() - start
    equal = None
    if service is not None and args.check:
        with ShardLoader(args.dataset, num_workers=min(2, args.check), **common) as local:
            local.set_epoch(0)
            want = [b for _, b in zip(range(len(kept)), local, strict=False)]
        equal = len(want) == len(kept) and all(torch.equal(a, c) and torch.equal(b, d)
                                               for (a, b), (c, d) in zip(kept, want, strict=True))
    print(json.dumps({"images_per_s": images / seconds, "equal": equal}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def local_cluster(cores: list[int], env: dict[str, str]) -> Any:
    """A one-node Ray cluster (``shardkit serve --head``) pinned to ``cores``; yields its address."""
    temp = tempfile.mkdtemp(prefix="sksvc", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    token = Path(temp) / "token"
    token.write_text(secrets.token_hex(32))
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0")
    port = _free_port()
    log = open(Path(temp) / "node.log", "wb")  # noqa: SIM115 (open while the node runs)
    node = subprocess.Popen(
        [sys.executable, "-m", "shardkit", "serve", "--head", "--port", str(port), "--num-cpus", str(len(cores)),
         "--", "--temp-dir", temp, "--include-dashboard", "false"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores))
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (Path(temp) / "node.log").read_text(errors="replace"):
            if node.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the Ray node did not start:\n{(Path(temp) / 'node.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGTERM)
        try:
            node.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        log.close()


def _run(args: argparse.Namespace, name: str, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.service_bench", "--child", *extra, "--dataset", args.dataset,
               "--batch", str(args.batch), "--size", str(args.size), "--epochs", str(args.epochs),
               "--seed", str(args.seed), "--check", str(args.check)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.service_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="/tmp/skservice", help="where the dataset is made (once)")
    parser.add_argument("--dataset", default="", help="a packed dataset to read instead")
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trainer-cores", type=int, default=2)
    parser.add_argument("--local-workers", type=int, default=16)
    parser.add_argument("--service-workers", type=int, default=0, help="default: the cores not the trainer's")
    parser.add_argument("--address", default="", help="an existing cluster (default: a node started here)")
    parser.add_argument("--check", type=int, default=3, help="service batches compared with local ones")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--child", choices=["local", "service"], default=None)
    parser.add_argument("--pin", default="")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        args.condition = args.child
        child(args)
        return
    cores = sorted(os.sched_getaffinity(0))
    trainer = cores[:args.trainer_cores]
    others = cores[args.trainer_cores:] or cores  # a host with no other cores shares them (said below)
    args.service_workers = args.service_workers or len(others)
    args.dataset = args.dataset or str(dataset(Path(args.root), args.images, workers=len(cores)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    pin = ",".join(map(str, trainer))
    with contextlib.ExitStack() as stack:
        if not args.address:
            args.address = stack.enter_context(local_cluster(others, env))
        conditions = {
            f"pinned-local ({len(trainer)} cores, {len(trainer)} workers)":
                ["local", "--pin", pin, "--workers", str(len(trainer))],
            f"pinned-service ({len(trainer)} cores, {args.service_workers} Ray workers)":
                ["service", "--pin", pin, "--address", args.address, "--service-workers",
                 str(args.service_workers)],
            f"local-{args.local_workers} (unpinned)": ["local", "--workers", str(args.local_workers)],
        }
        runs: dict[str, list[float]] = {name: [] for name in conditions}
        equal: list[bool] = []
        names = list(conditions)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # alternating, rotated
                got = _run(args, name, conditions[name], env)
                runs[name].append(got["images_per_s"])
                if got["equal"] is not None:
                    equal.append(got["equal"])
                print(f"  repeat {r + 1}: {name}: {got['images_per_s']:,.0f} img/s", file=sys.stderr)
    print(f"\nservice_bench: {args.dataset}, batch {args.batch}, {args.size} px, {args.epochs} epochs per run, "
          f"{args.repeats} alternating repeats; host cores {len(cores)}, trainer {trainer}, service {others}"
          + (" (no other cores: shared)" if others == cores else ""))
    print(f"{'condition':<48} {'median img/s':>13} {'min-max':>17}")
    for name, values in runs.items():
        print(f"{name:<48} {statistics.median(values):>13,.0f} {min(values):>8,.0f}-{max(values):<8,.0f}")
    print(f"service batches equal to local workers' (first {args.check} of epoch 0): "
          f"{'yes' if equal and all(equal) else 'NO'} ({len(equal)} runs checked)")
    if equal and not all(equal):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
