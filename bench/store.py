"""Store benchmark: a ~200 MB checkpoint to and from a loopback S3 server (moto or SeaweedFS), through
rentune's commit/discover protocol vs plain boto3 in the same run; and the time from SIGTERM to a committed
checkpoint in a real `rentune run` process.

    .venv/bin/python bench/store.py [--size-mb 200] [--repeats 7] [--server seaweedfs|moto]

Plain boto3 baselines: "tuned" (rentune's own part size and concurrency in a TransferConfig, every file
uploaded at once, a connection pool to match), the one to beat; the same with rentune's client setting
for checksums ("when_req": sent only when an operation requires one; botocore's default sends a CRC32 with
every part, which many S3-compatible stores reject); and boto3's defaults, one file after the other. A
warm-up round is not counted; in each round the contenders take turns going first, and the bucket is
emptied between rounds. rentune's upload also hashes every file (sha256, from the same read that
uploads it) and confirms each object before writing the manifest; its download verifies every hash.

Prints ratios rentune / plain boto3 (below 1: rentune is faster) of four figures: the median round, the
best round, and the median CPU seconds of this process (the client's threads) and of the server process.
On a shared 2-core machine the server and the client compete for the same cores and a round now and then
takes half as long again for reasons outside both: the best round shows what each costs when nothing
interferes, the median what a run of rounds met, and CPU what the client itself spent. moto keeps objects
in memory in one Python process and does work for S3's default checksums that a real S3 does on its own
hardware, so it is not the default here, and absolute MB/s say little about a real S3 endpoint.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from entrypoint.store.checkpoint import commit_checkpoint, find_latest  # noqa: E402
from entrypoint.store.s3 import S3Store  # noqa: E402
from tests.s3server import MotoServer, SeaweedServer, create_bucket, raw_client  # noqa: E402

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _checkpoint(folder: Path, size_mb: int) -> Path:
    """Weights (75%) and optimizer state (25%) of random bytes: incompressible, like real tensors."""
    folder.mkdir(parents=True)
    weights = size_mb * 3 // 4
    for name, mb in (("adapter_model.safetensors", weights), ("optimizer.pt", size_mb - weights)):
        with open(folder / name, "wb") as out:
            for _ in range(mb):
                out.write(os.urandom(1 << 20))
    (folder / "trainer_state.json").write_text('{"global_step": 1}')
    return folder


def _timed(fn, server) -> tuple[float, float, float]:
    """Wall seconds, this process's CPU seconds (the client: all its threads) and the server process's."""

    def server_cpu() -> float:
        times = server.cpu_times()
        return times.user + times.system

    started, cpu, served = time.perf_counter(), time.process_time(), server_cpu()
    fn()
    return time.perf_counter() - started, time.process_time() - cpu, server_cpu() - served


def _tuned_client(endpoint: str, checksums: str = "when_supported"):
    """A plain boto3 client with a connection pool large enough for every file's parts at once; `checksums`
    is botocore's request_checksum_calculation: its default, or rentune's "when_required"."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=64, request_checksum_calculation=checksums),
    )


def _empty(client, bucket: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def bench_transfers(endpoint: str, server_pid: int, size_mb: int, repeats: int, tmp: Path) -> None:
    import psutil
    from boto3.s3.transfer import TransferConfig

    from entrypoint.store.s3 import DEFAULT_MAX_CONCURRENCY, DEFAULT_PART_SIZE

    source = _checkpoint(tmp / "ckpt", size_mb)
    files = sorted(p for p in source.iterdir())
    bucket = create_bucket(endpoint)
    store = S3Store.from_uri(f"s3://{bucket}/rentune", endpoint_url=endpoint, addressing_style="path")
    plain, tuned, same = raw_client(endpoint), _tuned_client(endpoint), _tuned_client(endpoint, "when_required")
    server = psutil.Process(server_pid)
    config = TransferConfig(
        multipart_threshold=DEFAULT_PART_SIZE,
        multipart_chunksize=DEFAULT_PART_SIZE,
        max_concurrency=DEFAULT_MAX_CONCURRENCY,
    )

    def tuned_upload(client, folder: str) -> None:
        with ThreadPoolExecutor(max_workers=len(files)) as pool:
            list(pool.map(lambda f: client.upload_file(str(f), bucket, f"{folder}/{f.name}", Config=config), files))

    up_r, up_t, up_s, up_p, down_r, down_p = [], [], [], [], [], []
    for i in range(-1, repeats):  # round -1 warms the server and the connection pools: not counted
        uploads = [
            (up_r, lambda i=i: commit_checkpoint(store, "ckpt", i + 1, source, {"trial_id": "bench"})),
            (up_t, lambda i=i: tuned_upload(tuned, f"tuned/{i}")),
            (up_s, lambda i=i: tuned_upload(same, f"same/{i}")),
            (up_p, lambda i=i: [plain.upload_file(str(f), bucket, f"plain/{i}/{f.name}") for f in files]),
        ]
        for k in range(len(uploads)):  # each contender goes first in turn: no one always gets a fresh server
            times, upload = uploads[(i + k) % len(uploads)]
            seconds = _timed(upload, server)
            if i >= 0:
                times.append(seconds)
        if i >= 0:
            out = tmp / f"down-{i}"
            downloads = [
                (down_r, lambda out=out: find_latest(store, "ckpt", out / "rentune", print)),
                (down_p, lambda i=i, out=out: [
                    plain.download_file(bucket, f"plain/{i}/{f.name}", str(out / "plain" / f.name)) for f in files
                ]),
            ]  # fmt: skip
            (out / "plain").mkdir(parents=True)
            for k in range(len(downloads)):  # in turn first, as the uploads
                times, download = downloads[(i + k) % len(downloads)]
                times.append(_timed(download, server))
            shutil.rmtree(out)
        _empty(plain, bucket)  # moto holds every object in memory: keep each round's server the same
    print(f"{size_mb} MB, {repeats} rounds. Wall s: median, best round; CPU s (medians): client, server; rentune/boto3")
    for name, mine, theirs, which in (
        ("upload", up_r, up_t, "tuned boto3"),
        ("upload", up_r, up_s, "tuned, when_req"),
        ("upload", up_r, up_p, "boto3 defaults"),
        ("download", down_r, down_p, "boto3 defaults"),
    ):
        figures = []
        for label, pick, column in (
            ("median", statistics.median, 0), ("best", min, 0), ("client", statistics.median, 1),
            ("server", statistics.median, 2),
        ):  # fmt: skip
            m, t = pick(r[column] for r in mine), pick(r[column] for r in theirs)
            figures.append(f"{label} {m:4.2f}/{t:4.2f}={m / t:4.2f}")
        print(f"{name:<8} vs {which:<14} " + "  ".join(figures))


def bench_sigterm(endpoint: str, tmp: Path) -> None:
    """A real `rentune run` of a tiny model; SIGTERM after its first checkpoint; time until the next commit."""
    import yaml

    from tests.models import build_tiny_bert

    model = build_tiny_bert(tmp / "tiny")
    bucket = create_bucket(endpoint)
    spec = {
        "job": {"id": "bench-sigterm"},
        "hypothesis": {"task": "classification", "statement": "bench"},
        "model": {"path": str(model), "max_length": 32},
        "data": {"source": str(ROOT / "examples/data/tickets.jsonl")},
        "training": {"max_steps": 100000, "microbatch": 8, "device": "cpu", "checkpoint": {"every_steps": 20}},
        "store": {"uri": f"s3://{bucket}/runs", "endpoint_url": endpoint, "addressing_style": "path"},
    }
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))
    rentune = Path(sys.executable).parent / "rentune"
    proc = subprocess.Popen(
        [rentune, "run", str(tmp / "spec.yaml"), "--workdir", str(tmp / "work")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    for line in proc.stdout:
        if line.startswith("checkpoint: committed step"):
            break
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    wall = time.perf_counter() - sent
    reported = re.search(r"committed ([\d.]+) s after SIGTERM", out)
    print(
        f"sigterm  exit code {proc.returncode}; checkpoint committed {reported.group(1) if reported else '?'} s "
        f"after SIGTERM (process gone after {wall:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--server", choices=("seaweedfs", "moto"), default="seaweedfs",
        help="moto: an in-memory Python server; seaweedfs: a real S3-compatible server (Go) on local disk",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.update(ENV)
    server_class = MotoServer if args.server == "moto" else SeaweedServer
    with server_class() as server, tempfile.TemporaryDirectory() as tmp:
        bench_transfers(server.endpoint_url, server.pid, args.size_mb, args.repeats, Path(tmp))
        bench_sigterm(server.endpoint_url, Path(tmp))


if __name__ == "__main__":
    main()
