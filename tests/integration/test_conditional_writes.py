"""A store that does not honour conditional writes is refused at job and worker start, naming the
endpoint, before the frozen spec can be overwritten: a real S3 server (moto) behind a proxy that drops
`If-None-Match`, as some gateways do. The same server without the proxy passes the check."""

from __future__ import annotations

import hashlib

import pytest

from entrypoint.errors import EXIT_INVALID, exit_code
from entrypoint.job.queue import Worker
from entrypoint.job.state import freeze_spec, job_store
from entrypoint.runner import run_job
from entrypoint.store import StoreUnusable, check_conditional_writes
from entrypoint.store.s3 import S3Store
from tests.proxy import S3Proxy
from tests.s3server import create_bucket
from tests.specs import load, tiny_job

JOB = "same-id"


def _store(endpoint: str, bucket: str) -> S3Store:
    return S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=endpoint, addressing_style="path")


def test_the_real_server_honours_conditional_writes(s3_server):
    store = _store(s3_server, create_bucket(s3_server))
    check_conditional_writes(store, "scratch")
    assert list(store.list()) == []


def test_a_second_spec_through_a_header_dropping_proxy_is_refused_and_the_spec_kept(s3_server, tmp_path):
    bucket = create_bucket(s3_server)
    first = load(tiny_job(JOB, tmp_path / "model"))
    freeze_spec(job_store(_store(s3_server, bucket), JOB), first)  # the job, started earlier
    second = load(tiny_job(JOB, tmp_path / "model", training={"learning_rate": 0.1}))
    with S3Proxy(s3_server, drop="If-None-Match") as proxy:
        store = _store(proxy.endpoint_url, bucket)
        with pytest.raises(StoreUnusable, match="does not honour conditional writes") as caught:
            run_job(second, store, tmp_path / "work", lambda line: None)
        with pytest.raises(StoreUnusable, match=proxy.endpoint_url):
            Worker(store, lambda loaded, log: None, lambda line: None).loop(exit_when_idle=True)
        assert proxy.dropped >= 2  # the proxy really did drop the header
    assert proxy.endpoint_url in str(caught.value) and exit_code(caught.value) == EXIT_INVALID
    stored = _store(s3_server, bucket).get_bytes(f"jobs/{JOB}/spec.yaml")
    assert hashlib.sha256(stored).hexdigest() == first.sha256
    assert [info.key for info in _store(s3_server, bucket).list()] == [f"jobs/{JOB}/spec.yaml"]
