"""Background checkpoint commits in real `rentune run` processes, with the store behind a proxy that holds
back or fails the uploads of chosen checkpoints (tests/proxy.py, in front of moto):

- SIGKILL while step 20's commit is in flight: no manifest for it, and a fresh process resumes from 10;
- SIGTERM while step 20's commit is in flight: both it and the SIGTERM step are committed, exit 143;
- 503s on part of the uploads: botocore's retries absorb them, every checkpoint commits;
- every checkpoint upload failing: training goes on past the first failures (logged, in `rentune status`)
  and stops with the store's error after three in a row, instead of training on with nothing saved.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from entrypoint.store import PrefixedStore
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix, find_latest, list_steps
from entrypoint.store.committer import MAX_FAILED_COMMITS, Committer
from entrypoint.store.s3 import S3Store
from tests.models import build_tiny_bert
from tests.processes import rentune, start_run
from tests.proxy import S3Proxy
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec

EVERY = 10


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def _uploads_of(step: int):
    """A proxy rule matching the uploads (PUT, multipart POST) of checkpoint `step`'s files."""
    folder = f"/step-{step:08d}/"
    return lambda method, path: method in ("PUT", "POST") and folder in path and MANIFEST not in path


def _hold_uploads_of(step: int, seconds: float):
    """A proxy delay rule: checkpoint `step`'s uploads are held `seconds`, everything else goes at once."""
    matches = _uploads_of(step)
    return lambda method, path: seconds if matches(method, path) else 0


def _spec(tmp_path: Path, model: Path, endpoint: str, bucket: str, max_steps: int) -> Path:
    training = {"max_steps": max_steps, "seed": 7, "log_every_steps": 5, "checkpoint": {"every_steps": EVERY}}
    job = tiny_job("bg", model, training=training, store=s3_section(endpoint, bucket))
    return write_spec(tmp_path / "spec.yaml", job)


def _read_until(proc: subprocess.Popen, prefix: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"rentune exited ({proc.wait()}) before {prefix!r}:\n{''.join(lines[-40:])}")


def _job(endpoint: str, bucket: str) -> PrefixedStore:
    root = S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=endpoint, addressing_style="path")
    return PrefixedStore(root, "jobs/bg")


def _committed(job) -> list[int]:
    return sorted(step for step, names in list_steps(job, checkpoint_prefix("main")).items() if MANIFEST in names)


def test_sigkill_during_a_background_commit_resumes_from_the_previous_checkpoint(tmp_path, tiny_model, s3_server):
    bucket = create_bucket(s3_server)
    with S3Proxy(s3_server, delay=_hold_uploads_of(2 * EVERY, 3600)) as proxy:
        spec = _spec(tmp_path, tiny_model, proxy.endpoint_url, bucket, max_steps=60)
        first = start_run(spec, tmp_path / "node-a")
        # training went on past step 20 while step 20's upload hangs
        _read_until(first, "train: step 25/")
        first.send_signal(signal.SIGKILL)
        first.wait()
        job = _job(s3_server, bucket)
        assert _committed(job) == [EVERY]  # step 20 has no manifest: its commit never finished

        proxy.delay = lambda method, path: 0
        second = start_run(spec, tmp_path / "node-b")
        out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-4000:]
    assert f"train: resuming from committed checkpoint step {EVERY}" in out
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert result["resumed_from_step"] == EVERY and result["steps"] == 60
    (interrupted,) = result["interruptions"]  # the killed process: its last recorded step, at least step 1
    assert interrupted["resumed_from_step"] == EVERY and 1 <= interrupted["reached_step"] <= 25
    assert interrupted["lost_steps"] == max(0, interrupted["reached_step"] - EVERY)
    assert f"resuming from step {EVERY}: {interrupted['lost_steps']} steps lost" in out


def test_sigterm_during_a_background_commit_commits_it_and_the_final_one(tmp_path, tiny_model, s3_server):
    bucket = create_bucket(s3_server)
    with S3Proxy(s3_server, delay=_hold_uploads_of(2 * EVERY, 10)) as proxy:  # still in flight at SIGTERM under load
        spec = _spec(tmp_path, tiny_model, proxy.endpoint_url, bucket, max_steps=100000)
        proc = start_run(spec, tmp_path / "node-a")
        lines = _read_until(proc, "train: step 25/")
        proc.send_signal(signal.SIGTERM)
        out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, out[-4000:]
    job = _job(s3_server, bucket)
    committed = _committed(job)
    assert committed[:2] == [EVERY, 2 * EVERY] and committed[-1] > 25, committed  # in flight, then the last
    assert "for the commit before step" in out and "after SIGTERM" in out
    newest = find_latest(job, checkpoint_prefix("main"), tmp_path / "check", lambda line: None)
    assert newest is not None and newest.step == committed[-1]


def test_503s_during_a_background_upload_are_retried(tmp_path, s3_server):
    """Every other checkpoint upload request is answered 503 SlowDown; botocore retries each."""
    bucket = create_bucket(s3_server)
    counter = itertools.count()
    checkpoint_upload = _uploads_of(EVERY)
    with S3Proxy(s3_server, fail=lambda m, p: checkpoint_upload(m, p) and next(counter) % 2 == 0) as proxy:
        store = S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=proxy.endpoint_url, addressing_style="path")
        folder = tmp_path / "checkpoint-10"
        folder.mkdir()
        for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
            (folder / name).write_bytes(os.urandom(300_000))
        lines: list[str] = []
        committer = Committer(store, "ckpt", {"trial_id": "main"}, keep=2, log=lines.append)
        committer.commit(EVERY, folder, background=True)
        committer.wait()
        assert proxy.failed >= 2, "the proxy injected no 503"
    assert committer.committed == [EVERY] and committer.failures == 0, lines
    restored = find_latest(store, "ckpt", tmp_path / "restore", lines.append)
    assert restored is not None and restored.step == EVERY


def test_commits_that_keep_failing_stop_the_job_with_the_stores_error(tmp_path, tiny_model, s3_server):
    bucket = create_bucket(s3_server)
    checkpoint_upload = lambda method, path: "/checkpoints/" in path and method in ("PUT", "POST")  # noqa: E731
    with S3Proxy(s3_server, fail=checkpoint_upload) as proxy:
        spec = _spec(tmp_path, tiny_model, proxy.endpoint_url, bucket, max_steps=100000)
        # two requests per upload (no long backoff): each failed commit costs a second, not a minute
        proc = start_run(spec, tmp_path / "node-a", {"AWS_MAX_ATTEMPTS": "2"})
        out, _ = proc.communicate(timeout=600)
        status = rentune(
            "status", "bg", "--store", f"s3://{bucket}/runs", "--endpoint-url", s3_server,
            env={"RENTUNE_S3_ADDRESSING_STYLE": "path"},
        )  # fmt: skip
    assert proc.returncode not in (0, 143), out[-4000:]
    first_failure = out.index("checkpoint: commit of step 10 failed (1 in a row)")
    assert "the next checkpoint retries" in out[first_failure:]
    # training went on after each failure, and every next checkpoint tried again
    for n in range(2, MAX_FAILED_COMMITS + 1):
        assert f"checkpoint: commit of step {n * EVERY} failed ({n} in a row)" in out[first_failure:], out[-3000:]
    assert f"({MAX_FAILED_COMMITS + 1} in a row)" not in out  # no commit started after the streak
    assert f"{MAX_FAILED_COMMITS} checkpoint commits in a row failed; stopping" in out
    assert "SlowDown" in out.split(f"{MAX_FAILED_COMMITS} checkpoint commits in a row failed")[1]
    assert status.returncode == 0, status.stderr
    assert f"checkpoint commits failing: {MAX_FAILED_COMMITS} in a row" in status.stdout, status.stdout
