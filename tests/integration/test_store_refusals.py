"""A store that refuses the client ends a command with exit 2 and says what to check first: a missing
bucket (moto), credentials the server refuses (SeaweedFS, which checks signatures), through real `rentune`
processes; and an S3 AccessDenied (injected) is refused the same way and never read as a missing key."""

from __future__ import annotations

from pathlib import Path

from tests.models import build_tiny_bert
from tests.processes import rentune
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec


def test_run_against_a_missing_bucket_exits_2_naming_the_bucket_and_what_to_check(tmp_path, s3_server):
    model = build_tiny_bert(tmp_path / "bert")
    spec = write_spec(
        tmp_path / "spec.yaml", tiny_job("nobucket", model, store=s3_section(s3_server, "no-such-bucket"))
    )
    result = rentune("run", str(spec), "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "the bucket 'no-such-bucket' does not exist on this server (NoSuchBucket)" in result.stderr
    assert "Check first the bucket in store.uri" in result.stderr and "aws s3 mb s3://no-such-bucket" in result.stderr
    assert "job failed" not in result.stderr


def test_submit_with_a_wrong_secret_says_the_credentials_were_refused_and_exits_2(tmp_path, seaweed_server):
    bucket = create_bucket(seaweed_server)
    job = tiny_job("refused", Path("/models/bert"), store=s3_section(seaweed_server, bucket))
    spec = write_spec(tmp_path / "spec.yaml", job)
    env = {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    store = ("--store", f"s3://{bucket}/runs", "--endpoint-url", seaweed_server, "--addressing-style", "path")
    result = rentune("submit", str(spec), "--node-paths", *store, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "head failed: 403 Forbidden with no reason given" in result.stderr  # its first request: a HEAD
    assert "your credentials were refused, or they may not head here" in result.stderr
    assert "Check first AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in result.stderr
    result = rentune("status", "refused", *store, cwd=tmp_path, env={"AWS_ACCESS_KEY_ID": "nobody"})
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "your credentials were refused: the server knows no such access key (InvalidAccessKeyId)" in result.stderr
    result = rentune("status", "refused", *store, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "your credentials were refused: the secret key does not match the access key" in result.stderr
