"""An HTTP/1.1 keep-alive reverse proxy on 127.0.0.1 (for S3 tests against the moto server).

moto's server answers every request with ``Connection: close``, so an S3 client talking to it
never holds an idle connection in its pool. Real S3 keeps connections alive, and some faults
only show with a pooled connection (a forked process inheriting its parent's). This proxy
forwards each request to ``upstream`` on a fresh connection and answers the client on a
persistent one. Real sockets, real HTTP: nothing of shardkit or its clients is mocked.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Hop-by-hop headers and those the handler writes itself.
_DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "server", "date", "content-length"})


class KeepAliveProxy:
    """Serve ``http://127.0.0.1:<port>`` as ``upstream`` with persistent client connections."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        host, port = upstream

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive unless the client asks to close

            def log_message(self, *_args: Any) -> None:
                pass

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
                conn = http.client.HTTPConnection(host, port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in _DROPPED:
                        self.send_header(key, value)
                length = reply.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
