"""A cloud provider's instance metadata endpoint on 127.0.0.1, for the interruption-notice tests: AWS's
IMDSv2 (a session token by PUT, then GETs that must carry it) and GCP's metadata server (GETs that must
carry `Metadata-Flavor: Google`). A test raises a notice at the moment it chooses; the server records
when it first served one, and every request it saw."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["FakeMetadata"]

TOKEN = "AQAEAFakeImdsV2Token=="


class FakeMetadata:
    def __init__(self):
        self.spot_action: dict | None = None
        self.maintenance: list[dict] = []
        self.gcp_preempted = False
        self.gcp_maintenance = "NONE"
        self.raised_at: float | None = None  # time.time() when a notice was raised
        self.first_served_at: float | None = None  # when a request first got a notice back
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, authorised)
        self.failing = False  # answer every request with HTTP 500
        self._server: ThreadingHTTPServer | None = None

    # -- what the provider says ------------------------------------------------------------------------------
    def raise_spot_notice(self, lead_seconds: float = 120.0, action: str = "terminate") -> None:
        at = datetime.now(timezone.utc) + timedelta(seconds=lead_seconds)
        self.raised_at = time.time()
        self.spot_action = {"action": action, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def schedule_maintenance(self, in_seconds: float, state: str = "active", code: str = "system-reboot") -> None:
        start = datetime.now(timezone.utc) + timedelta(seconds=in_seconds)
        aws_time = "%d %b %Y %H:%M:%S GMT"  # AWS's own format: "21 Jan 2019 09:00:43 GMT", no weekday
        self.maintenance.append(
            {
                "Code": code,
                "Description": "scheduled reboot",
                "EventId": f"instance-event-{len(self.maintenance)}",
                "NotBefore": start.strftime(aws_time),
                "NotAfter": (start + timedelta(hours=2)).strftime(aws_time),
                "State": state,
            }
        )

    def raise_gcp_preemption(self) -> None:
        self.raised_at = time.time()
        self.gcp_preempted = True

    # -- the HTTP side ---------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeMetadata:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                if fake.failing:
                    fake.requests.append(("PUT", self.path, False))
                    return self._answer(500)
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                fake.requests.append(("PUT", self.path, bool(ok)))
                self._answer(200, TOKEN) if ok else self._answer(400)

            def do_GET(self):
                path = self.path
                if fake.failing:
                    fake.requests.append(("GET", path, False))
                    return self._answer(500)
                if path.startswith("/latest/"):
                    ok = self.headers.get("X-aws-ec2-metadata-token") == TOKEN
                    fake.requests.append(("GET", path, ok))
                    if not ok:
                        return self._answer(401)
                    if path == "/latest/meta-data/spot/instance-action" and fake.spot_action is not None:
                        fake._served()
                        return self._answer(200, json.dumps(fake.spot_action))
                    if path == "/latest/meta-data/events/maintenance/scheduled":
                        return self._answer(200, json.dumps(fake.maintenance))
                    return self._answer(404)
                if path.startswith("/computeMetadata/v1/instance/"):
                    ok = self.headers.get("Metadata-Flavor") == "Google"
                    fake.requests.append(("GET", path, ok))
                    if not ok:
                        return self._answer(403)
                    name = path.rsplit("/", 1)[1]
                    if name == "preempted":
                        if fake.gcp_preempted:
                            fake._served()
                        return self._answer(200, "TRUE" if fake.gcp_preempted else "FALSE")
                    if name == "maintenance-event":
                        return self._answer(200, fake.gcp_maintenance)
                fake.requests.append(("GET", path, False))
                return self._answer(404)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _served(self) -> None:
        if self.first_served_at is None:
            self.first_served_at = time.time()

    def __exit__(self, *exc) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
