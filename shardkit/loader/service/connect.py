"""Connecting the training process to the service's Ray cluster, within a time limit.

Ray is imported here (and in :mod:`~shardkit.loader.service.client`) only, when a loader with a
service is built. The address is checked before ``ray.init`` runs, and ``ray.init`` runs under a
time limit (:func:`shardkit._ray_reach.join_cluster`): a bad address is a one-line
:class:`~shardkit.errors.LoaderError` in seconds, never a hang.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from shardkit import _ray_reach
from shardkit.errors import LoaderError

__all__ = ["INSTALL_HINT", "cluster_gone", "connect", "disconnect", "import_ray"]

INSTALL_HINT = "pip install 'shardkit[ray]'"


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
        _ray_reach.join_cluster(ray, address, timeout)
    except (ValueError, ConnectionError) as unreachable:
        raise LoaderError(str(unreachable).replace("give the head's address, HEAD:6379",
                                                   "pass RayService(address='HEAD:6379')")) from None
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
