"""`rentune cancel` on a real S3 server (moto): `submit` prints follow-up commands that work as printed,
cancel takes a queued job off the queue (its spec kept), no worker starts it afterwards, a second cancel
and a cancel of a job a worker holds are refused (a dead worker's stale claim is not), and nothing stored is
lost."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from entrypoint.job.queue import DEFAULT_CLAIM_SECONDS, Worker
from entrypoint.job.state import dumps
from entrypoint.store.s3 import S3Store
from tests.processes import rentune
from tests.s3server import create_bucket
from tests.specs import tiny_job, write_spec


def _printed(out: str, prefix: str) -> list[str]:
    """The command a line of `submit`'s output prints after `prefix`, as arguments after `rentune`."""
    line = next(line for line in out.splitlines() if line.startswith(prefix))
    command = shlex.split(line[len(prefix) :])
    assert command[0] == "rentune", line
    return command[1:]


def test_cancel_takes_a_queued_job_off_and_refuses_a_held_one(tmp_path, s3_server):
    bucket = create_bucket(s3_server)
    uri = f"s3://{bucket}/rentune"
    flags = ["--store", uri, "--endpoint-url", s3_server, "--addressing-style", "path"]
    root = S3Store.from_uri(uri, endpoint_url=s3_server, addressing_style="path")
    spec = write_spec(tmp_path / "a.yaml", tiny_job("cancel-a", Path("/models/bert")))

    submitted = rentune("submit", str(spec), "--node-paths", *flags, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    status = rentune(*_printed(submitted.stdout, "follow it with: "), cwd=tmp_path)
    assert status.returncode == 0 and "cancel-a: queued" in status.stdout, status.stdout + status.stderr
    cancelled = rentune(*_printed(submitted.stdout, "take it off the queue before a worker starts it: "), cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert (
        f"cancelled cancel-a: no worker will start it; its spec is kept at {uri}/queue/cancelled/" in cancelled.stdout
    )
    assert root.get_bytes("queue/cancelled/cancel-a.yaml") == spec.read_bytes()
    assert root.head("queue/cancel-a.yaml") is None
    ran: list[str] = []
    worker = Worker(root, lambda loaded, log: ran.append(loaded.spec.job.id), log=lambda m: None)
    assert worker.queued() == [] and worker.run_one("cancel-a") is False and ran == []
    status = rentune("status", "cancel-a", *flags, cwd=tmp_path)
    assert "cancel-a: cancelled before a worker started it" in status.stdout, status.stdout + status.stderr

    again = rentune("cancel", "cancel-a", *flags, cwd=tmp_path)
    assert again.returncode == 2 and "job 'cancel-a' is not queued" in again.stderr, again.stderr
    # cancelled, the job id can be submitted again, and a worker claims it at once (the cancel's claim is released)
    assert rentune("submit", str(spec), "--node-paths", *flags, cwd=tmp_path).returncode == 0
    claim = worker.try_claim("cancel-a")
    assert claim is not None and claim.number == 2
    held = rentune("cancel", "cancel-a", *flags, cwd=tmp_path)
    assert held.returncode == 3, held.stdout + held.stderr
    assert f"job 'cancel-a' is held by worker {worker.name} (claim 2): it runs" in held.stderr
    assert root.get_bytes("queue/cancel-a.yaml") == spec.read_bytes()  # still queued, untouched

    # the worker died (its heartbeat older than the lease): its claim no longer holds the job, and the cancel
    # keeps the spec cancelled the first time beside this one
    root.put_bytes(
        claim.key("heartbeat"), dumps({"worker": worker.name, "at": time.time() - 2 * DEFAULT_CLAIM_SECONDS})
    )
    root.put_bytes("queue/cancel-a.yaml", spec.read_bytes() + b"# the second submission\n")
    stale = rentune("cancel", "cancel-a", *flags, cwd=tmp_path)
    assert stale.returncode == 0, stale.stdout + stale.stderr
    assert f"its spec is kept at {uri}/queue/cancelled/cancel-a.3.yaml" in stale.stdout, stale.stdout
    assert root.get_bytes("queue/cancelled/cancel-a.yaml") == spec.read_bytes()
    assert root.get_bytes("queue/cancelled/cancel-a.3.yaml").endswith(b"# the second submission\n")
    assert root.head("queue/cancel-a.yaml") is None


def test_submit_refuses_a_local_path_a_worker_cannot_read_naming_each_field(tmp_path, s3_server):
    bucket = create_bucket(s3_server)
    flags = ["--store", f"s3://{bucket}/rentune", "--endpoint-url", s3_server, "--addressing-style", "path"]
    root = S3Store.from_uri(f"s3://{bucket}/rentune", endpoint_url=s3_server, addressing_style="path")
    spec = write_spec(tmp_path / "local.yaml", tiny_job("local-paths", Path("/models/bert")))

    refused = rentune("submit", str(spec), *flags, cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    for field, path in (("model.path", "/models/bert"), ("data.source", "examples/data/tickets.jsonl")):
        assert f"{spec}: {field}: " in refused.stderr and path in refused.stderr, refused.stderr
    assert "a worker on a node cannot read" in refused.stderr and "--node-paths" in refused.stderr
    assert list(root.list("queue")) == []  # nothing queued

    # the same spec naming the bucket's copies is queued as it is
    s3_spec = tiny_job("s3-paths", Path("/unused"), data={"source": f"s3://{bucket}/data/tickets.jsonl"})
    s3_spec["model"]["path"] = f"s3://{bucket}/models/bert"
    queued = rentune("submit", str(write_spec(tmp_path / "s3.yaml", s3_spec)), *flags, cwd=tmp_path)
    assert queued.returncode == 0, queued.stdout + queued.stderr
    assert [info.key for info in root.list("queue")] == ["queue/s3-paths.yaml"]
