"""A real S3 server for tests: moto's standalone server in a subprocess on a free loopback port.

Nothing global is touched: the server gets its own copy of the environment, and `create_bucket` builds a
client with moto's fake credentials passed explicitly. Only 127.0.0.1 is ever bound or contacted.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import boto3
from botocore.awsrequest import AWSResponse
from botocore.config import Config

__all__ = ["HOST", "Faults", "MotoServer", "create_bucket", "raw_client"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # importing moto takes a few seconds; a loaded CI runner can take much longer


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class MotoServer:
    """`python -m moto.server -H 127.0.0.1 -p PORT` as a subprocess; use as a context manager.

    `start()` returns once the server answers HTTP; it raises RuntimeError with the server's log if the
    process exits first or does not answer within `START_TIMEOUT_S`. `stop()` terminates it (then kills).
    """

    def __init__(self) -> None:
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("moto server not started")
        return f"http://{HOST}:{self.port}"

    def start(self, attempts: int = 3) -> str:
        """Start on a free port (retrying with another port if the first is taken meanwhile)."""
        last_error = ""
        for _ in range(attempts):
            self.port = _free_port()
            fd, log = tempfile.mkstemp(prefix="moto-server-", suffix=".log")
            self._log = Path(log)
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env.pop("MOTO_PORT", None)
            with os.fdopen(fd, "wb") as out:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            try:
                self._wait_ready()
                return self.endpoint_url
            except RuntimeError as err:
                last_error = str(err)
                self.stop()
        raise RuntimeError(f"moto server did not start after {attempts} attempts: {last_error}")

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._log is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"exited with {self._proc.returncode}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP answer means it is serving
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"no answer on {self.endpoint_url} within {START_TIMEOUT_S:.0f} s:\n{self._log_tail()}")

    def _log_tail(self, limit: int = 4000) -> str:
        try:
            return self._log.read_text(errors="replace")[-limit:] if self._log else ""
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)
            self._proc = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def raw_client(endpoint_url: str):
    """A plain boto3 S3 client on the test server, with moto's fake credentials passed explicitly."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # moto accepts any credentials
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3}),
    )


def create_bucket(endpoint_url: str, stem: str = "rentune-test") -> str:
    """Create a bucket with a unique name on the test server and return its name."""
    name = f"{stem}-{uuid.uuid4().hex[:16]}"
    raw_client(endpoint_url).create_bucket(Bucket=name)
    return name


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_kwargs):
        yield self.data


class Faults:
    """A botocore 'before-send' hook answering a seeded-random share of requests itself with an S3 error,
    as a throttling or failing server would; the rest go to the real server."""

    def __init__(
        self, rate: float, status: int = 503, code: str = "SlowDown", seed: int = 1234, limit: int | None = None
    ):
        self.rate, self.status, self.code, self.limit = rate, status, code, limit
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.sent = 0
        self.injected = 0
        self.requests: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request, **_kwargs):
        with self._lock:
            self.sent += 1
            self.requests.append((request.method, dict(request.headers)))
            if self._rng.random() >= self.rate or self.injected == self.limit:
                return None
            self.injected += 1
        body = f"<Error><Code>{self.code}</Code><Message>injected by the test</Message></Error>".encode()
        headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        return AWSResponse(request.url, self.status, headers, _Body(body))
