"""Connecting the training process to the service's Ray cluster, within a time limit.

Ray is imported here (and in :mod:`~shardkit.loader.service.client`) only, when a loader with a
service is built. ``ray.init`` waits minutes on an address where no cluster answers, so the
address is resolved first, then its port must answer an HTTP/2 greeting as a gRPC server (Ray's
GCS and its client server) does, each within the timeout; ``ray.init`` itself runs under a
longer one as a backstop: a bad address is a one-line :class:`~shardkit.errors.LoaderError` in
seconds, never a hang.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from shardkit import _ray_reach
from shardkit.errors import LoaderError

__all__ = ["INSTALL_HINT", "cluster_gone", "connect", "disconnect", "import_ray"]

INSTALL_HINT = "pip install 'shardkit[ray]'"
#: Seconds ``ray.init`` may take once the address answered (it starts a local core worker).
INIT_TIMEOUT_S = 60.0


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        LoaderError: Ray is not installed (with the install command).
    """
    try:
        import ray
    except ImportError as err:
        raise LoaderError(f"service= needs Ray in this environment and on the cluster's nodes: {INSTALL_HINT} "
                          f"({err})") from None
    return ray


def connect(address: str, *, timeout: float) -> Any:
    """``ray``, connected to the cluster at ``address`` (kept as it is when already connected).

    The process stays connected after the loader closes (other loaders may share it);
    ``ray.shutdown()`` disconnects.

    Raises:
        LoaderError: Ray is missing, no cluster is found or reached at ``address`` within
            ``timeout`` seconds, or ``ray.init`` fails or does not return in time.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    try:
        resolved = _ray_reach.reach_cluster(address, timeout)
    except (ValueError, ConnectionError) as unreachable:
        raise LoaderError(str(unreachable).replace("give the head's address, HEAD:6379",
                                                   "pass RayService(address='HEAD:6379')")) from None
    outcome: list[BaseException | None] = []

    def init() -> None:
        quiet = _NotMainThread()
        logger = logging.getLogger("ray._private.worker")
        logger.addFilter(quiet)
        try:
            ray.init(address=resolved, log_to_driver=False, logging_level=logging.WARNING)
            outcome.append(None)
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
        raise LoaderError(f"{resolved} answers as a gRPC server but Ray did not connect to it within {limit:g} s "
                          f"(is it the head node's GCS port, 6379 by default?)")
    err = outcome[0]
    if err is not None:
        raise LoaderError(f"cannot connect to the Ray cluster at {resolved} ({_why(err)})") from err
    return ray


def cluster_gone(ray: Any, timeout: float = 2.0, tries: int = 3, pause: float = 1.0) -> str | None:
    """Why the cluster this process is connected to is gone: its head node's GCS refused every
    one of ``tries`` connections, ``pause`` seconds apart (a GCS restarting refuses a moment).
    None while it answers, and wherever that cannot be told: a GCS slow to answer, an address
    not reached (a route, a name, a firewall), a ``ray://`` client connection (whose GCS address
    is the cluster's own, which the client may not reach)."""
    try:
        from ray.util.client import ray as client

        if client.is_connected():
            return None
        address = str(ray.get_runtime_context().gcs_address)
        host, port = _ray_reach.split_address(address)
    except Exception:  # not connected, or an address of another form: nothing to ask
        return None
    for attempt in range(tries):
        if attempt:
            time.sleep(pause)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except ConnectionRefusedError as err:
            refused = err
            continue
        except OSError:  # timed out, no route, no name, no file descriptor: not known to be gone
            return None
        return None
    return f"its head node's GCS at {address} refuses connections ({refused.strerror or refused})"


def disconnect(ray: Any, timeout: float = 30.0) -> None:
    """``ray.shutdown()``, waited for at most ``timeout`` seconds. With its cluster gone, Ray ends
    the process a minute later (its GCS client gives up and exits); disconnected, it does not."""
    thread = threading.Thread(target=ray.shutdown, name="shardkit-ray-disconnect", daemon=True)
    thread.start()
    thread.join(timeout)


def _why(err: BaseException) -> str:
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
    (the loader connects in a thread it can stop waiting for; the training script's handlers stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()
