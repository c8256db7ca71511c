"""A node of the preprocessing service's Ray cluster: the ``ray start`` command that ``shardkit serve`` runs.

A service node is a plain Ray node that also offers its CPUs as the custom resource
:data:`SERVICE_RESOURCE`: when a cluster has any, the loader places its workers on those nodes
only (so a training host that joined the cluster, or nodes kept for other work, take none);
otherwise on any node's CPUs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from shardkit._ray_reach import split_address
from shardkit.errors import ShardkitError

__all__ = ["DEFAULT_PORT", "SERVICE_RESOURCE", "start_command"]

#: The custom Ray resource a service node offers, one per CPU.
SERVICE_RESOURCE = "shardkit_service"
#: The head node's GCS port (Ray's default).
DEFAULT_PORT = 6379


def start_command(*, head: bool, address: str | None, port: int = DEFAULT_PORT, num_cpus: int | None = None,
                  extra: Sequence[str] = ()) -> list[str]:
    """The ``ray start --block`` command line (of this interpreter's Ray) for a service node.

    ``head``: start a cluster, its GCS on ``port``; else join the one at ``address``
    (``HOST:PORT``). ``num_cpus``: CPUs offered (default: every core of the node). ``extra``:
    further ``ray start`` options, passed as they are.

    Raises:
        ShardkitError: both or neither of ``head`` and ``address``, an address without its port,
            a ``port`` that is none, or ``num_cpus`` < 1.

    Example:
        >>> start_command(head=False, address="10.0.0.5:6379", num_cpus=4)[3:]
        ['start', '--block', '--disable-usage-stats', '--num-cpus', '4', '--resources', '{"shardkit_service": 4}', \
'--address', '10.0.0.5:6379']
    """
    if head == (address is not None):
        raise ShardkitError("give either --head (start a cluster) or --address HEAD:PORT (join one)")
    if address not in (None, "auto"):  # "auto": the cluster this node is in, found as it joins
        if address.startswith("ray://"):  # a client's address: `ray start` joins by the head's GCS port
            raise ShardkitError(f"--address: a node joins by the head's address HOST:PORT (its GCS port, 6379 by "
                                f"default), not a ray:// client address, got {address!r}")
        try:
            split_address(address)
        except ValueError as err:
            raise ShardkitError(f"--address: a node joins by HOST:PORT, got {address!r}") from err
    if head and not 0 < port < 65536:
        raise ShardkitError(f"--port must be a port number (1 to 65535), got {port}")
    cpus = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
    if cpus < 1:
        raise ShardkitError(f"--num-cpus must be at least 1, got {cpus}")
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
               "--num-cpus", str(cpus), "--resources", json.dumps({SERVICE_RESOURCE: cpus})]
    command += ["--head", "--port", str(port)] if head else ["--address", str(address)]
    return [*command, *extra]
