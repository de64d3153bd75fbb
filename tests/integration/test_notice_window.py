"""The notice window through real `rentune` processes: a store slow enough that the commit after SIGTERM
cannot finish within training.checkpoint.grace_seconds (a proxy holds the probe's measured upload back), so
the plan sets a periodic interval that keeps one interruption's loss within max_lost_minutes, `rentune
status` says so, and the trial's trainer commits at least that often."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.store import PrefixedStore
from entrypoint.store.s3 import S3Store
from tests.models import build_tiny_bert
from tests.processes import rentune
from tests.proxy import S3Proxy
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec

HELD = 3.0  # seconds the proxy holds the probe's upload: the store's measured rate
GRACE, BOUND_MINUTES = 2.0, 0.25  # 15 s


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def test_a_checkpoint_that_cannot_commit_in_its_grace_gets_a_shorter_interval_and_the_loss_bound(
    tmp_path, tiny_model, s3_server
):
    bucket = create_bucket(s3_server)
    # A periodic checkpoint every 100,000 steps: an interruption would lose the whole trial.
    checkpoint = {"every_steps": 100_000, "grace_seconds": GRACE, "max_lost_minutes": BOUND_MINUTES}
    held = lambda method, path: HELD if method == "PUT" and "store-check.bin" in path else 0  # noqa: E731
    with S3Proxy(s3_server, delay=held) as proxy:
        store = s3_section(proxy.endpoint_url, bucket)
        spec = write_spec(
            tmp_path / "spec.yaml", tiny_job("notice", tiny_model, training={"checkpoint": checkpoint}, store=store)
        )
        probed = rentune("run", str(spec), "--workdir", str(tmp_path / "work"), "--until", "probe", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr[-3000:]

    job = PrefixedStore(
        S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path"), "jobs/notice"
    )
    plan = json.loads(job.get_bytes("plan.json"))
    notice = plan["notice"]
    assert notice["commit_seconds"] > HELD > GRACE and not notice["fits"]
    assert notice["limit"] == f"grace_seconds {GRACE:g} s"
    cost = notice["commit_seconds"] - plan["figures"]["step"]["value"]  # the save and the upload
    assert notice["interval_source"] == "plan"
    assert notice["interval_minutes"] == pytest.approx((BOUND_MINUTES * 60 - cost) / 60)
    assert notice["lost_minutes"] == pytest.approx(BOUND_MINUTES) and notice["lost_steps"] > 0
    assert plan["notice_line"].startswith("notice window: a commit on SIGTERM takes ")
    assert "does NOT fit grace_seconds 2 s" in plan["notice_line"]
    assert f"periodic commits every {notice['interval_minutes']:.3g} min (set by the plan" in plan["notice_line"]

    endpoint = ("--endpoint-url", s3_server, "--addressing-style", "path")
    status = rentune("status", "notice", "--store", f"s3://{bucket}/runs", *endpoint)
    assert status.returncode == 0 and plan["notice_line"] in status.stdout.splitlines(), status.stdout

    spec.write_text(spec.read_text().replace(proxy.endpoint_url, s3_server))  # the proxy is gone: a moved store
    trained = rentune("run", str(spec), "--workdir", str(tmp_path / "work"), "--until", "train", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    log = job.get_bytes("attempts/2/log.txt").decode()
    assert (
        f"checkpoint: committing at least every {notice['interval_minutes']:.3g} min: the plan's notice window" in log
    )
