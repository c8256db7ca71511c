"""``shardkit serve``: run this machine as a CPU node of a preprocessing service's Ray cluster."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import time

import click

from shardkit._ray_reach import NotRayError, reach_cluster
from shardkit.errors import ShardkitError
from shardkit.serve import DEFAULT_PORT, SERVICE_RESOURCE, start_command

#: Seconds the head at --address has to answer, unless --wait says otherwise.
DEFAULT_WAIT_S = 60.0

#: Seconds one try to reach the head at --address has (RayService's own check).
REACH_TIMEOUT_S = 5.0


def _wait_for_head(address: str, wait: float) -> None:
    """Return once the head at ``address`` answers as a Ray cluster, trying for ``wait`` seconds (a
    head started beside this node, in the same job, may still be starting).

    Raises:
        ShardkitError: it did not answer in time (the last reason why).
    """
    started = time.monotonic()
    told = False
    while True:
        try:
            reach_cluster(address, REACH_TIMEOUT_S)
            return
        except ValueError as err:  # "auto" found a ray:// address (RAY_ADDRESS), which a node cannot join by
            raise ShardkitError(f"--address {address}: {err}") from None
        except NotRayError as err:  # an open port of something else: waiting will not change it
            raise ShardkitError(f"--address: {err}") from None
        except ConnectionError as err:
            if time.monotonic() - started >= wait:
                raise ShardkitError(f"--address: {err} (tried for {time.monotonic() - started:.0f} s; --wait SECONDS "
                                    "tries longer)") from None
            if not told:
                click.echo(f"shardkit serve: waiting up to {wait:g} s for the head at {address} ({err})", err=True)
                told = True
            time.sleep(1.0)


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--head", is_flag=True, help="Start a cluster: this node is its head.")
@click.option("--address", metavar="HOST:PORT", default=None, help="Join the cluster whose head is at HOST:PORT.")
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True, help="The head's GCS port (--head).")
@click.option("--num-cpus", type=int, default=None, help="CPUs this node offers [default: all its cores].")
@click.option("--dry-run", is_flag=True, help="Print the `ray start` command instead of running it.")
@click.option("--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="With --address: how long the head may take to answer (it may be starting beside this node) "
                   "[default: 60]; an address that answers as something else than Ray is refused at once.")
@click.argument("ray_options", nargs=-1, type=click.UNPROCESSED)
def serve_command(head: bool, address: str | None, port: int, num_cpus: int | None, dry_run: bool,
                  wait: float | None, ray_options: tuple[str, ...]) -> None:
    """Run this machine as a CPU node of the service: `ray start --block` with its CPUs offered as
    the `shardkit_service` resource, so ShardLoader(service=RayService(...)) places its workers
    here. Further `ray start` options go after `--`. Stops on Ctrl-C.

    \b
    shardkit serve --head                          # on the first CPU node
    shardkit serve --address HEAD:6379             # on every other CPU node
    ShardLoader(..., service=RayService("HEAD:6379", workers=32))   # in the training script
    """
    if wait is not None and address is None:
        raise ShardkitError("--wait applies with --address (how long the head may take to answer)")
    command = start_command(head=head, address=address, port=port, num_cpus=num_cpus, extra=ray_options)
    if dry_run:
        click.echo(shlex.join(command))
        return
    if importlib.util.find_spec("ray") is None:
        raise ShardkitError("shardkit serve needs Ray on this node: pip install 'shardkit[ray]'")
    if address is not None:  # `ray start` waits minutes, printing Ray's warnings, on an address no head answers
        _wait_for_head(address, DEFAULT_WAIT_S if wait is None else wait)
    cpus = command[command.index("--num-cpus") + 1]
    where = f"a cluster with its head here, port {port}" if head else f"the cluster at {address}"
    click.echo(f"shardkit serve: {cpus} CPUs of this node join {where} as the {SERVICE_RESOURCE} resource; "
               f"Ctrl-C stops the node", err=True)
    sys.stderr.flush()
    os.execv(command[0], command)  # the node's process from here on: its signals go to `ray start`
