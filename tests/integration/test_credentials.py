"""A credential in a URL that comes from the environment (MLFLOW_TRACKING_URI, RENTUNE_METADATA_URL) is
used, never recorded: a real `rentune run` tracks to an MLflow file store through a URI holding a token and
watches notices at a metadata address holding a password, and no object of the job's store (tracking.json,
checkpoint manifests, the attempt's log, env.json, results) holds either secret."""

from __future__ import annotations

import json
import socket

from mlflow import MlflowClient

from tests.models import build_tiny_bert
from tests.processes import start_run
from tests.specs import tiny_job, write_spec

TOKEN, PASSWORD = "T0KEN-4f1c", "PASSW-9a2e"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_credentials_in_urls_from_the_environment_are_used_but_never_stored(tmp_path, monkeypatch):
    model = build_tiny_bert(tmp_path / "bert")
    training = {"max_steps": 8, "checkpoint": {"every_steps": 4}}
    spec = write_spec(tmp_path / "spec.yaml", tiny_job("creds", model, training=training, tracking={"mlflow": {}}))
    store = tmp_path / "store"
    env = {
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "MLFLOW_TRACKING_URI": f"file://{tmp_path}/mlruns?token={TOKEN}",
        "RENTUNE_INTERRUPTION_NOTICE": "aws",  # nothing answers there: the watcher logs its address
        "RENTUNE_METADATA_URL": f"http://watcher:{PASSWORD}@127.0.0.1:{_closed_port()}",
        "RENTUNE_NOTICE_POLL_SECONDS": "0.2",
    }
    proc = start_run(spec, tmp_path / "work", env, "--store", f"file://{store}", "--until", "train")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert TOKEN not in out and PASSWORD not in out
    assert "token=REDACTED" in out or "127.0.0.1" in out  # the log still says where it tracked and watched

    ids = json.loads((store / "jobs/creds/trials/main/tracking.json").read_text())
    assert ids["mlflow"]["tracking_uri"].endswith("mlruns?token=REDACTED")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file://{tmp_path}/mlruns")  # the runs are there
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [ids["mlflow"]["run_id"]]
    files = [p for p in store.rglob("*") if p.is_file()]
    assert any(p.name == "MANIFEST.json" for p in files) and any(p.name == "log.txt" for p in files)
    leaked = [str(p.relative_to(store)) for p in files if TOKEN.encode() in p.read_bytes()]
    leaked += [str(p.relative_to(store)) for p in files if PASSWORD.encode() in p.read_bytes()]
    assert not leaked
