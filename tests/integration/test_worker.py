"""Remote submission through the bucket: two real `rentune worker` processes against the loopback S3
server and three submitted jobs. Each job runs exactly once and completes; one worker is SIGKILLed in
the middle of a job and the other takes that job over after the lease timeout, resuming from its
checkpoint. An invalid spec in the queue is moved to queue/rejected/ with its errors and the workers go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from entrypoint.job.queue import submit
from entrypoint.store import PrefixedStore
from entrypoint.store.s3 import S3Store
from jobspec import parse_spec
from tests.models import build_tiny_bert
from tests.s3server import create_bucket
from tests.specs import tiny_job

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"
JOBS = ("w-a", "w-b", "w-c")


def _spec(job_id: str, model: Path, seed: int) -> dict:
    training = {"max_steps": 80, "log_every_steps": 10, "checkpoint": {"every_steps": 20, "keep": 2}}
    # a different split seed per job: each job has its own sealed test split
    return tiny_job(job_id, model, data={"split": {"seed": seed}}, training=training)


def _worker(store_uri: str, endpoint: str, workdir: Path) -> subprocess.Popen:
    command = [
        RENTUNE, "worker", "--store", store_uri, "--endpoint-url", endpoint, "--addressing-style", "path",
        "--workdir", str(workdir), "--claim-seconds", "6", "--poll-seconds", "0.5", "--exit-when-idle",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_workers_share_the_queue_and_take_over_a_dead_workers_job(s3_server, tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    bucket = create_bucket(s3_server)
    store_uri = f"s3://{bucket}/rentune"
    root = S3Store.from_uri(store_uri, endpoint_url=s3_server, addressing_style="path")
    for seed, job_id in enumerate(JOBS[1:], start=21):
        submit(root, parse_spec(yaml.safe_dump(_spec(job_id, model, seed)), source=f"{job_id}.yaml"))
    # the first job goes through the CLI, as from a laptop
    first = tmp_path / "w-a.yaml"
    first.write_text(yaml.safe_dump(_spec("w-a", model, 20)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    flags = ["--store", store_uri, "--endpoint-url", s3_server, "--addressing-style", "path"]
    queued = subprocess.run(
        [RENTUNE, "submit", str(first), "--node-paths", *flags], env=env, capture_output=True, text=True
    )
    assert queued.returncode == 0 and "queued w-a" in queued.stdout, queued.stderr
    again = subprocess.run(
        [RENTUNE, "submit", str(first), "--node-paths", *flags], env=env, capture_output=True, text=True
    )
    assert again.returncode == 3  # already queued: never overwritten
    # an invalid spec that reached the queue without `rentune submit` (an old client, a hand-made file)
    bad = _spec("bad", model, 1)
    bad["training"]["learning_rate"] = -1
    root.put_bytes("queue/bad.yaml", yaml.safe_dump(bad).encode())

    worker_a = _worker(store_uri, s3_server, tmp_path / "node-a")
    worker_b = _worker(store_uri, s3_server, tmp_path / "node-b")
    out_b: list[str] = []
    reader = threading.Thread(target=lambda: out_b.extend(worker_b.stdout), daemon=True)
    reader.start()
    out_a, victim = [], None
    for line in worker_a.stdout:
        out_a.append(line)
        if line.startswith("worker:") and " runs " in line:
            victim = line.split(" runs ")[1].split()[0]
        if line.startswith("checkpoint: committed step 40"):
            worker_a.send_signal(signal.SIGKILL)  # node loss in the middle of training
            break
    worker_a.wait(timeout=60)
    assert victim is not None, "".join(out_a[-30:])
    assert worker_b.wait(timeout=600) == 0, "".join(out_b[-40:])
    reader.join(timeout=10)
    log_b = "".join(out_b)

    for job_id in JOBS:
        job = PrefixedStore(root, f"jobs/{job_id}")
        assert job.head("phases/export/result.json") is not None, f"{job_id} did not complete\n{log_b[-3000:]}"
        attempts = {i.key.split("/")[1] for i in job.list("attempts")}
        claims = sorted(i.key for i in job.list("claims") if i.key.endswith(".json"))
        if job_id == victim:
            assert attempts == {"1", "2"} and len(claims) == 2, (attempts, claims)
            main = json.loads(job.get_bytes("trials/main/result.json"))
            assert main["resumed_from_step"] is not None and main["resumed_from_step"] >= 40
            assert f"claim 1 on {victim} is stale" in log_b
        else:
            assert attempts == {"1"} and len(claims) == 1, (job_id, attempts, claims)  # ran exactly once
    assert [i.key for i in root.list("queue")] == ["queue/rejected/bad.errors.txt", "queue/rejected/bad.yaml"]
    errors = root.get_bytes("queue/rejected/bad.errors.txt").decode()
    assert "training.learning_rate: expected greater than 0" in errors
    assert "rejected bad" in "".join(out_a) + log_b

    shown = subprocess.run([RENTUNE, "logs", victim, *flags], env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and "== attempt 1" in shown.stdout and "== attempt 2" in shown.stdout
    assert "train: resuming from committed checkpoint step" in shown.stdout
