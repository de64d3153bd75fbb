"""An HTTP proxy on loopback in front of a real S3 server, to make it misbehave the way real ones do:

- `drop`: a request header removed on the way (`If-None-Match`, as some gateways and older S3-compatible
  servers do: conditional writes silently stop working);
- `delay(method, path)`: seconds to hold a request before forwarding it (a slow link, an upload in flight);
- `fail(method, path)`: True to answer 503 SlowDown instead of forwarding (an overloaded or failing server);
- `mangle(method, path, body)`: the response body as the client gets it (a bit flipped in transit).

Both callables can be replaced while the proxy runs; `failed` counts the requests answered with 503."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["S3Proxy"]

# Not forwarded: hop-by-hop headers, and Expect (this proxy answers the client's 100-continue itself).
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "expect",
}  # fmt: skip


_SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>injected by the test proxy</Message></Error>"


class S3Proxy:
    """`with S3Proxy(upstream) as proxy:` then point clients at `proxy.endpoint_url`. `dropped` counts the
    requests whose `drop` header was removed."""

    def __init__(
        self,
        upstream: str,
        drop: str | None = None,
        delay: Callable[[str, str], float] | None = None,
        fail: Callable[[str, str], bool] | None = None,
        mangle: Callable[[str, str, bytes], bytes] | None = None,
    ):
        target = urlsplit(upstream)
        owner = self
        self.dropped = 0
        self.failed = 0
        self.delay = delay or (lambda method, path: 0.0)
        self.fail = fail or (lambda method, path: False)
        self.mangle = mangle or (lambda method, path, body: body)
        drop = drop or ""

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                time.sleep(owner.delay(self.command, self.path))
                if owner.fail(self.command, self.path):
                    owner.failed += 1
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(_SLOW_DOWN)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                if drop and any(k.lower() == drop.lower() for k in headers):
                    owner.dropped += 1
                    headers = {k: v for k, v in headers.items() if k.lower() != drop.lower()}
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = owner.mangle(self.command, self.path, response.read())
                finally:
                    conn.close()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                # a HEAD answer has no body but the object's length, which must pass unchanged
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
