"""Reaching a Ray cluster within a time limit: ``ray.init`` waits minutes on an address where no
cluster answers, so :func:`reach_cluster` resolves the address first, then its port must answer
an HTTP/2 greeting as a gRPC server (Ray's GCS and its client server) does; :func:`join_cluster`
then runs ``ray.init`` under a longer limit as a backstop, and says in a line why it failed (with
the fix where the cluster wants a token). Used by the preprocessing service and by
``shardkit pack --ray``; each raises its own error with these messages."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from shardkit._compat import ray_bootstrap_address

__all__ = ["INIT_TIMEOUT_S", "NotRayError", "join_cluster", "reach_cluster", "split_address", "why_not_joined"]


class NotRayError(ConnectionError):
    """The address answers connections but not as a Ray cluster: waiting will not change that."""

#: Seconds ``ray.init`` may take once the address answered (it starts a local core worker).
INIT_TIMEOUT_S = 60.0


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
    """Refuse an address whose machine does not answer a connection, whose port is closed, or
    open but not a gRPC server (which answers an HTTP/2 greeting with its SETTINGS frame; then
    :class:`NotRayError`), within ``timeout`` seconds."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:  # no answer to the connection itself: a machine still starting, or a firewall
        raise ConnectionError(f"cannot reach the Ray cluster at {address} within {timeout:g} s (no answer to a "
                              "connection: the machine is down or starting, or a firewall drops it)") from None
    except OSError as err:
        raise ConnectionError(f"cannot reach the Ray cluster at {address} within {timeout:g} s "
                              f"({type(err).__name__}: {err}); is its head node running (`ray status`)?") from None
    try:
        with conn:
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
        raise NotRayError(f"{address} accepts connections but did not answer as a Ray cluster within "
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


def join_cluster(ray: Any, address: str, timeout: float) -> str:
    """Connect ``ray`` as a driver to the cluster at ``address``: :func:`reach_cluster` within
    ``timeout`` seconds, then ``ray.init`` within ``max(INIT_TIMEOUT_S, timeout)``. Returns the
    address connected to.

    Raises:
        ValueError: not an address.
        ConnectionError: as :func:`reach_cluster`, or ``ray.init`` failed or did not return in time.
    """
    resolved = reach_cluster(address, timeout)
    outcome: list[BaseException | None] = []
    given_up = threading.Event()

    def init() -> None:
        quiet = _NotMainThread()
        logger = logging.getLogger("ray._private.worker")
        logger.addFilter(quiet)
        try:
            ray.init(address=resolved, log_to_driver=False, logging_level=logging.WARNING)
            outcome.append(None)
            if given_up.is_set():  # connected after the caller stopped waiting: nobody would disconnect
                ray.shutdown()
        except BaseException as err:  # handed to the caller's thread
            outcome.append(err)
        finally:
            logger.removeFilter(quiet)

    # ray.init retries for minutes where a gRPC server answers but no cluster does: it runs in a
    # thread the caller stops waiting for (the thread ends with ray's own retries).
    thread = threading.Thread(target=init, name="shardkit-ray-connect", daemon=True)
    thread.start()
    limit = max(INIT_TIMEOUT_S, timeout)
    thread.join(limit)
    if not outcome:
        given_up.set()
        raise ConnectionError(f"{resolved} answers as a gRPC server but Ray did not connect to it within {limit:g} s "
                              f"(is it the head node's GCS port, 6379 by default?)")
    err = outcome[0]
    if err is not None:
        raise ConnectionError(f"cannot connect to the Ray cluster at {resolved} ({why_not_joined(err)})") from err
    return resolved


def why_not_joined(err: BaseException) -> str:
    """What went wrong connecting, in a line: the innermost cause, with the fix for a missing token."""
    cause = err
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause)
    if type(cause).__name__ == "AuthenticationError" or any(sign in text for sign in _AUTH_REFUSED):
        # Ray 2.60 raises it as such, or as "Failed to connect to GCS" with the refusal in a traceback's text
        return ("the cluster uses token authentication and refused this process: set RAY_AUTH_MODE=token and make "
                "the cluster's token readable here (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines and lines[0].endswith("Traceback (most recent call last):"):  # a traceback as text: its last line says
        lines = [lines[0].removesuffix("Traceback (most recent call last):").rstrip(" :") + ": " + lines[-1]]
    return f"{type(cause).__name__}: {lines[0][:300]}" if lines else type(cause).__name__


#: What a GCS refusal for a missing or wrong token says somewhere in Ray's error text.
_AUTH_REFUSED = ("InvalidAuthToken", "UNAUTHENTICATED", "AuthenticationError", "Invalid authentication token")


class _NotMainThread(logging.Filter):
    """Drops Ray's warning that a driver connected outside the main thread sets no SIGTERM handler
    (the connection is made in a thread the caller can stop waiting for; its own handlers stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()
