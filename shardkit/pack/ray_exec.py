"""Run planned shards as Ray tasks: the same ``write_shard`` calls, spread over a Ray cluster.

Ray is imported here only, and only when a Ray pack is asked for. Output bytes do not depend
on the executor: the plan is made (purely) in the driver and every task writes one shard.
Every node of the cluster needs shardkit installed (tasks run ``shardkit.pack.write.write_shard``).

Stopping early never calls ``ray.cancel``: Ray (2.60) cancels a task whose result is arriving by
failing it while its reply completes it, and the driver dies on an internal check ("Tried to complete
task that was not pending", a C++ abort with no Python exception), a race no caller can avoid (it
hit about one Ctrl-C in two). Ctrl-C ends the pack's own connection instead (a cluster it started
is stopped; on one it joined, Ray kills a finished driver's tasks); an error, or Ctrl-C on a Ray
the caller connected, lets the tasks in flight finish (their shards are kept for a resume).
"""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shardkit._ray_reach import join_cluster
from shardkit.errors import PackError, ShardkitError
from shardkit.pack.pool import ctrl_c_deferred
from shardkit.pack.write import ShardDone, ShardReceipt, ShardTask, write_shard
from shardkit.sources.files import Files
from shardkit.storage import Store

INSTALL_HINT = "pip install 'shardkit[ray]'"
#: Tasks submitted but not finished, per CPU of the cluster: enough to keep every CPU busy
#: while results come back, without submitting (and pickling) 100k shards up front.
IN_FLIGHT_PER_CPU = 2
#: Seconds the cluster at ``--ray ADDRESS`` has to answer before ``ray.init`` is tried.
REACH_TIMEOUT_S = 10.0

#: Whether this process's Ray connection is :func:`ray_cluster`'s, which ends it with the pack
#: (else it is the caller's, and outlives the pack).
_connected_here = False


def import_ray() -> Any:
    """Return the ``ray`` module.

    Raises:
        PackError: Ray is not installed (the message has the install command).
    """
    try:
        import ray
    except ImportError as err:
        raise PackError(f"packing with Ray needs Ray installed: {INSTALL_HINT}") from err
    return ray


def check_ray_destination(store: Store) -> None:
    """Refuse destinations that Ray workers cannot share with the driver.

    Raises:
        PackError: ``store`` is process-local (``memory://``).
    """
    if store.process_local:
        raise PackError("memory:// is per process, so shards written by Ray workers would be lost; "
                        "pack into a directory or a shared URL (s3://, gs://, …)", where=store.url)


def check_ray_source(files: Files) -> None:
    """Refuse sources that Ray workers cannot read.

    Raises:
        PackError: ``files`` are process-local (``memory://``).
    """
    if files.process_local:
        raise PackError("memory:// is per process, so Ray workers would not find the source's "
                        "files; pack from a directory or a shared URL (s3://, gs://, …)",
                        where=files.root)


@contextmanager
def ray_cluster(address: str | None, num_cpus: int) -> Iterator[Any]:
    """Yield ``ray``, connected to a cluster for the duration of the block.

    An already initialised Ray is used as is and left running. Otherwise ``address`` (``"auto"``,
    ``"ray://host:port"``, ``"host:port"``) is connected to, or, when ``None``, a local cluster of
    ``num_cpus`` CPUs is started; either is shut down (disconnected) on exit.

    Raises:
        PackError: Ray is missing, the cluster at ``address`` does not answer within
            :data:`REACH_TIMEOUT_S` or refuses this process (why, in a line), or a local one
            cannot start.
    """
    global _connected_here
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    try:
        if address is not None:
            try:
                join_cluster(ray, address, REACH_TIMEOUT_S)
            except (ValueError, ConnectionError) as refused:
                raise PackError(str(refused), where="" if address in str(refused) else address) from None
        else:
            # Ctrl-C is held until the local cluster is up (seconds): raised inside ray.init, it left
            # Ray's agent processes running after the pack and the process died of SIGSEGV at exit.
            with _quiet_token_notice(), ctrl_c_deferred((signal.SIGINT,)):
                try:
                    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                             logging_level=logging.WARNING)
                except (ConnectionError, RuntimeError, ValueError) as err:
                    if "existing cluster" in str(err):  # Ray joins a local cluster it finds, with no num_cpus
                        raise PackError("a Ray cluster is already running (on this machine, or at RAY_ADDRESS): use "
                                        "it with --ray auto (executor='ray', ray_address='auto'), or stop it (ray "
                                        "stop) for a cluster of the pack's own; a node stopped by a signal "
                                        "other than Ctrl-C leaves the same trace, which ray stop clears",
                                        where="local") from err
                    raise PackError(f"cannot start a Ray cluster ({err})", where="local") from err
        _connected_here = True
        yield ray
    finally:
        _connected_here = False
        if ray.is_initialized():
            ray.shutdown()


class _TokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


@contextmanager
def _quiet_token_notice() -> Iterator[None]:
    """Leave out Ray's notice that a new local cluster has token authentication on (its secure
    default) while the pack starts one of its own: the cluster lives only as long as the pack,
    and the notice cut into the progress bar. Ray's warning that authentication is *off*
    (``RAY_AUTH_MODE=disabled``) still shows."""
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    notice = _TokenNotice()
    log.addFilter(notice)
    try:
        yield
    finally:
        log.removeFilter(notice)


def write_on_ray(
    tasks: list[ShardTask], *, workers: int, address: str | None, on_done: ShardDone | None
) -> tuple[list[ShardReceipt], dict[str, int]]:
    """Write ``tasks`` on the Ray cluster at ``address`` (see :func:`ray_cluster`; a local one of
    ``workers`` CPUs when ``None``) with :func:`run_ray`. No cluster is touched when ``tasks``
    is empty."""
    if not tasks:
        return [], {}
    with ray_cluster(address, num_cpus=workers) as ray:
        return run_ray(ray, tasks, on_done)


def _write_where(task: ShardTask, cwd: str) -> tuple[ShardReceipt, str]:
    """The Ray task: :func:`write_shard`, and the id of the node that ran it. ``cwd``: the
    driver's working directory, which relative local paths start from (a worker starts in the
    one ``ray start`` ran in); local paths reach only a single-node cluster (:func:`_check_nodes`)."""
    import ray

    try:
        before = os.getcwd()
        os.chdir(cwd)
    except OSError:  # not this worker's to enter (another user's home): absolute paths and URLs need it not
        return write_shard(task), ray.get_runtime_context().get_node_id()
    try:
        return write_shard(task), ray.get_runtime_context().get_node_id()
    finally:
        os.chdir(before)  # the worker runs the job's other tasks where it was


def _check_nodes(ray: Any, task: ShardTask) -> None:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return
    for remote, where, what, why in (
        (task.store.remote, task.store.url, "is a local path", "would write to their own disks; pack into"),
        (task.files.remote, task.files.root, "the source is a local path", "would not find its files; pack from"),
    ):
        if not remote:
            raise PackError(f"{what} but the Ray cluster has {len(nodes)} nodes: workers on other nodes {why} "
                            "a shared URL (s3://, gs://, …) or use a single-node cluster", where=where)


def run_ray(
    ray: Any,
    tasks: list[ShardTask],
    on_done: ShardDone | None,
    *,
    max_in_flight: int | None = None,
) -> tuple[list[ShardReceipt], dict[str, int]]:
    """Write ``tasks`` as Ray tasks (one CPU each) on the connected cluster. Returns the
    receipts in completion order, and how many shards each node wrote (by Ray node id).

    At most ``max_in_flight`` tasks (default: ``IN_FLIGHT_PER_CPU`` per cluster CPU) are
    submitted at a time. ``on_done`` gets each finished shard's task and receipt (it may raise to
    stop the pack). What finished stays, so a re-run resumes. Tasks are never cancelled (see the
    module doc): on Ctrl-C, when :func:`ray_cluster` made the connection, it is ended at once (and
    with it the tasks in flight); otherwise those finish before the error or interrupt is raised.

    Raises:
        PackError: a shard failed (named, with the worker's error as cause), or DST is a local
            path on a multi-node cluster.
    """
    if not tasks:
        return [], {}
    _check_nodes(ray, tasks[0])
    limit = max_in_flight or max(1, int(ray.cluster_resources().get("CPU", 1)) * IN_FLIGHT_PER_CPU)
    # SPREAD: over every node that has a CPU free (Ray's default fills one node first, so a small
    # pack could run on the head node alone while the others idle).
    remote_write = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_write_where)
    running: dict[Any, ShardTask] = {}
    receipts: list[ShardReceipt] = []
    nodes: Counter[str] = Counter()

    def collect() -> None:
        receipt, node = _collect_one(ray, running, on_done)
        receipts.append(receipt)
        nodes[node] += 1

    try:
        for task in tasks:
            running[remote_write.remote(task, os.getcwd())] = task
            if len(running) >= limit:
                collect()
        while running:
            collect()
    except BaseException as stop:
        if running and _connected_here and not isinstance(stop, Exception):
            ray.shutdown()  # Ctrl-C: the pack's own driver ends, and Ray stops its tasks
        elif running:
            # Nothing may write this pack's state once this returns (a re-run could be writing it);
            # a second Ctrl-C stops waiting.
            ray.wait(list(running), num_returns=len(running))
        raise
    return receipts, dict(sorted(nodes.items()))


def _collect_one(ray: Any, running: dict[Any, ShardTask],
                 on_done: ShardDone | None) -> tuple[ShardReceipt, str]:
    [ref], _ = ray.wait(list(running), num_returns=1)
    task = running.pop(ref)
    where = task.store.path(task.plan.name)
    try:
        receipt, node = ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = err.cause if isinstance(err.cause, BaseException) else err
        what = (str(cause) if isinstance(cause, ShardkitError)
                else f"{type(cause).__name__}: {cause}")
        raise PackError(f"writing the shard failed ({what}); re-run the same command to resume",
                        where=where) from cause
    except ray.exceptions.RayError as err:
        raise PackError(f"the Ray task writing the shard was lost ({type(err).__name__}: {err}); "
                        "re-run the same command to resume", where=where) from err
    if on_done is not None:
        on_done(task, receipt)
    return receipt, node
