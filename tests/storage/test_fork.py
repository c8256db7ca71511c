"""A forked process (a DataLoader worker) leaves the S3 clients it inherited from its parent alone.

The parent's s3fs filesystem is copied into the child with the finalizer that closes its client.
When the child's garbage collector frees that copy, the finalizer ran there: from fsspec's IO
thread it closed the parent's connection pool on the child's event loop, which fails ("Task
exception was never retrieved ... attached to a different loop" on stderr); from the
main thread it waited a second on the parent's loop, which no thread runs in the child. The
parent must hold a pooled connection for the first to show: moto closes every connection, so
these tests talk to it through a keep-alive proxy (tests/keepalive.py).
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from shardkit.storage import Store
from tests.keepalive import KeepAliveProxy

pytest.importorskip("s3fs")


@pytest.fixture
def kept_alive(s3_server: dict[str, Any]) -> Any:
    """``storage_options`` reaching the moto server through a keep-alive proxy."""
    endpoint = urlsplit(s3_server["client_kwargs"]["endpoint_url"])
    proxy = KeepAliveProxy((str(endpoint.hostname), int(endpoint.port or 80)))
    yield {**s3_server, "client_kwargs": {"endpoint_url": proxy.url}}
    proxy.close()


def _in_child(body: Callable[[], str]) -> tuple[int, str, str]:
    """Run ``body`` in a forked child; its exit status, what it returned, and what it wrote to fd 2."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        # the garbage earlier tests of this process left (their loaders, pools, clusters) freed here,
        # not in the child below, which unfreezes and collects what it inherited
        gc.collect()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                # what this child inherited may be frozen (the loader's fork hooks, installed by any
                # earlier test in this process): collectable again, so these tests see the inherited
                # filesystems as a child that collects them would
                gc.unfreeze()
                # as in a process of its own: fd 2 is stderr, and asyncio's errors reach it
                # through logging's last resort (pytest's capture and log handlers are not there)
                os.dup2(err.fileno(), 2)
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                faulthandler.enable(sys.stderr)  # a crash says where, in what the test shows
                logging.root.handlers.clear()
                out.write(body().encode())
                out.flush()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode(errors="replace")


def _parent_store(bucket: str, options: dict[str, Any]) -> Store:
    store = Store(f"{bucket}/fork", options)
    store.write_bytes("a", b"x" * 5000)
    assert store.read_bytes("a") == b"x" * 5000  # the parent's client now pools a connection
    return store


def test_collecting_the_parents_filesystem_in_the_io_thread_prints_nothing(
        s3_bucket: str, kept_alive: dict[str, Any]) -> None:
    store = _parent_store(s3_bucket, kept_alive)

    def child() -> str:
        from fsspec.asyn import get_loop, sync

        store.read_bytes("a")  # the child's own client replaces the parent's; fsspec's IO thread runs

        async def collect() -> None:
            gc.collect()  # where a collection often lands in a long load: every download allocates there

        sync(get_loop(), collect)
        time.sleep(0.3)  # what the collection scheduled runs and is freed
        gc.collect()
        return store.read_bytes("a").decode()

    code, out, err = _in_child(child)
    assert code == 0 and out == "x" * 5000, err
    assert "Task exception was never retrieved" not in err, err
    assert "attached to a different loop" not in err, err
    assert store.read_bytes("a") == b"x" * 5000  # the parent's client still works


def test_collecting_the_parents_filesystem_in_the_main_thread_does_not_stall(
        s3_bucket: str, kept_alive: dict[str, Any]) -> None:
    store = _parent_store(s3_bucket, kept_alive)

    def child() -> str:
        import s3fs.core

        # s3fs's finalizer closes a client by waiting on its loop (fsspec's sync, a timeout each):
        # in the child nothing runs the parent's loop, so every such wait is a stall. Counted, not
        # timed: a loaded machine stretches a collection's wall time as much as a stall.
        waits = []
        wait = s3fs.core.sync

        def counted(loop: Any, *args: Any, **kwargs: Any) -> Any:
            waits.append(loop)
            return wait(loop, *args, **kwargs)

        s3fs.core.sync = counted
        gc.collect()  # the store still holds the parent's filesystem; the rest of the heap is visited once
        store.read_bytes("a")  # the child's own filesystem replaces it
        gc.collect()  # frees the parent's filesystem
        return str(len(waits))

    code, out, err = _in_child(child)
    assert code == 0, err
    assert out == "0", f"freeing the parent's filesystem in the child waited {out} times on the parent's loop"
