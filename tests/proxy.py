"""An HTTP proxy on loopback that drops the `If-None-Match` header, as some gateways and older
S3-compatible servers do: every request goes on to the real server, minus conditional-write semantics."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["HeaderDroppingProxy"]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


class HeaderDroppingProxy:
    """`with HeaderDroppingProxy(upstream) as proxy:` then point clients at `proxy.endpoint_url`.
    `dropped` counts the requests whose `drop` header was removed."""

    def __init__(self, upstream: str, drop: str = "If-None-Match"):
        target = urlsplit(upstream)
        owner = self
        self.dropped = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                if any(k.lower() == drop.lower() for k in headers):
                    owner.dropped += 1
                    headers = {k: v for k, v in headers.items() if k.lower() != drop.lower()}
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HeaderDroppingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
