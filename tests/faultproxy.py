"""A fault-injecting TCP proxy on 127.0.0.1 (for S3 tests against the moto server).

Each client connection is forwarded to ``upstream``. A ``faults`` callable, asked once per
connection with its number, picks what happens to it: ``None`` (forwarded intact), ``"reset"``
(closed before any reply), or ``("truncate", n)`` (the reply stream is cut after ``n`` bytes and
the connection closed: a response body shorter than its Content-Length, which aiohttp reports as
``ClientPayloadError``). Real sockets, real faults: nothing of shardkit or its clients is mocked.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

Fault = Any  # None | "reset" | ("truncate", int)


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], faults: Callable[[int], Fault]) -> None:
        self.upstream, self.faults = upstream, faults
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.injected = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self.server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                number = self.connections
                self.connections += 1
            fault = self.faults(number)
            if fault is not None:
                with self._lock:
                    self.injected += 1
            threading.Thread(target=self._serve, args=(client, fault), daemon=True).start()

    def _serve(self, client: socket.socket, fault: Fault) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        if fault == "reset":
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                client.recv(65536)  # the request arrived; answer it with a reset
            client.close()
            upstream.close()
            return
        limit = fault[1] if isinstance(fault, tuple) else None
        done = threading.Event()

        def pump(src: socket.socket, dst: socket.socket, budget: int | None) -> None:
            sent = 0
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if budget is not None and sent + len(data) >= budget:
                        dst.sendall(data[: budget - sent])
                        break
                    dst.sendall(data)
                    sent += len(data)
            except OSError:
                pass
            finally:
                done.set()

        threading.Thread(target=pump, args=(client, upstream, None), daemon=True).start()
        pump(upstream, client, limit)
        done.wait(1)
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
