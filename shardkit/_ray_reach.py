"""Where a Ray cluster is, and whether it answers there, within a time limit: ``ray.init`` waits
minutes on an address where no cluster answers, so :func:`reach_cluster` resolves the address
first, then its port must answer an HTTP/2 greeting as a gRPC server (Ray's GCS and its client
server) does. Used by the preprocessing service and by ``shardkit pack --ray``; each raises its
own error with these messages."""

from __future__ import annotations

import socket

from shardkit._compat import ray_bootstrap_address

__all__ = ["reach_cluster", "split_address"]


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``"HOST:PORT"`` or ``"ray://HOST:PORT"``.

    Raises:
        ValueError: no port, or not a number.

    Example:
        >>> split_address("ray://10.0.0.5:10001"), split_address("[::1]:6379")
        (('10.0.0.5', 10001), ('::1', 6379))
    """
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a Ray address is 'auto', 'HOST:PORT' or 'ray://HOST:PORT', got {address!r}")
    return host.strip("[]"), int(port)


def _resolve(address: str) -> str:
    """``address`` with ``"auto"`` replaced by the cluster this node belongs to."""
    if address != "auto":
        return address
    try:
        found = ray_bootstrap_address("auto")
    except ConnectionError:
        found = None
    if not found:
        raise ConnectionError("no Ray cluster runs on this node (address='auto'): start one (`ray start --head`, or "
                              "`shardkit serve --head`) or join one (`ray start --address HEAD:6379`), or give "
                              "the head's address, HEAD:6379")
    return str(found)


#: An HTTP/2 client's greeting: the connection preface and an empty SETTINGS frame.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


def _reach(host: str, port: int, timeout: float, address: str) -> None:
    """Refuse an address whose port is closed, or open but not a gRPC server (which answers an
    HTTP/2 greeting with its SETTINGS frame), within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(_HTTP2_HELLO)
            head = b""
            while len(head) < 9 and (chunk := conn.recv(9 - len(head))):
                head += chunk
    except TimeoutError:
        head = b""
    except OSError as err:
        raise ConnectionError(f"cannot reach the Ray cluster at {address} within {timeout:g} s "
                              f"({type(err).__name__}: {err}); is its head node running (`ray status`)?") from None
    if len(head) < 9 or head[3] != _SETTINGS:
        raise ConnectionError(f"{address} accepts connections but did not answer as a Ray cluster within "
                              f"{timeout:g} s (the GCS port of the head node, 6379 by default, or a ray:// client "
                              "port, 10001, is expected)")


def reach_cluster(address: str, timeout: float) -> str:
    """The cluster's address (``"auto"`` resolved), once its port answered as a gRPC server.

    Raises:
        ValueError: not an address.
        ConnectionError: no cluster found for ``"auto"``, or none answering at the address within
            ``timeout`` seconds.
    """
    resolved = _resolve(address)
    host, port = split_address(resolved)
    _reach(host, port, timeout, resolved)
    return resolved
