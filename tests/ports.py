"""Free TCP ports for the servers tests start (Ray nodes, torch.distributed stores).

A port the kernel picks (bind to port 0) comes from its ephemeral range, the range it also draws
the local port of every outgoing connection from: on a busy machine such a port can be taken by a
connection of another test between the moment it is picked and the moment the server binds it,
and the server then fails to start (a Ray head exits with code 1). The ports here are picked below
that range, where only an explicit bind can take them, and above Ray's worker ports (10002-19999).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000  # above Ray's default worker ports, 10002-19999


def _ephemeral_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; other systems start theirs at 49152
    return low if low > _LOWEST + 1000 else 65536  # a range that starts low leaves nothing below it


_given: set[int] = set()  # ports handed out by this process: never twice, even once closed again


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to now, outside the ephemeral range."""
    high = _ephemeral_start()
    for _ in range(1000):
        port = random.randrange(_LOWEST, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free TCP port between {_LOWEST} and {high}")
