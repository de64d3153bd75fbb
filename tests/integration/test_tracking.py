"""Tracking with the real libraries in their offline modes: TensorBoard event files read back with its own
EventAccumulator, an MLflow file store read with MlflowClient, W&B offline run files read record by record.

A job with two trials is SIGKILLed in the middle of the first trial's training, after the trackers have
logged steps beyond its newest checkpoint, and resumed in a fresh process with an empty work dir (another
"node"); W&B's folder is a volume both share, as offline W&B needs. Each tracker must then hold one run per
trial, every step from 1 to the last exactly once, the same losses in all three, and the results.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from entrypoint.store import PrefixedStore
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix, list_steps
from entrypoint.store.s3 import S3Store
from tests.models import build_tiny_bert
from tests.processes import rentune, start_run
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec
from tests.wandb_records import history

MAX_STEPS = 120
EVERY = 10
JOB = "tracked"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def _env(tmp_path: Path) -> dict:
    return {
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 keeps its file store behind this switch
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb-volume"),
        "WANDB_API_KEY": "",
    }


def _mlflow_steps(mlruns: Path, metric: str) -> list[int]:
    """Steps of `metric` in the MLflow file store's runs, read from its files while the job writes them."""
    steps = []
    for path in mlruns.glob(f"*/*/metrics/{metric}"):
        steps += [int(line.split()[2]) for line in path.read_text().splitlines() if line.strip()]
    return steps


def _wandb_steps(volume: Path, run_id: str) -> list[int]:
    """Steps of train/loss in the offline files of `run_id` that reached the disk so far."""
    return [
        row["_step"]
        for path in sorted(volume.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
        for row in history(path)
        if "train/loss" in row
    ]


def _held(job, tmp: Path) -> dict:
    """The newest committed checkpoint (a manifest, not just files) and the last step each tracker holds."""
    steps = list_steps(job, checkpoint_prefix("main"))
    ids = json.loads(job.get_bytes("trials/main/tracking.json")) if job.head("trials/main/tracking.json") else None
    return {
        "committed": max((step for step, names in steps.items() if MANIFEST in names), default=0),
        "mlflow": max(_mlflow_steps(tmp / "mlruns", "train/loss"), default=0),
        "wandb": max(_wandb_steps(tmp / "wandb-volume", ids["wandb"]["id"]), default=0) if ids else 0,
    }


def _kill_after_checkpoint_and_more_steps(job, proc: subprocess.Popen, tmp: Path, timeout: float = 300) -> dict:
    """SIGKILL once a checkpoint past step 2*EVERY is committed and the trackers hold steps after it (W&B's
    service writes its offline file in 32 KiB blocks, about 50 steps: wait for one block past the checkpoint
    while steps remain), so the resumed process replays steps some trackers already hold. Returns what was
    committed and held once the process was dead, and whether W&B was waited for."""
    deadline = time.monotonic() + timeout
    while True:
        held = _held(job, tmp)
        committed = held["committed"]
        wandb_past = held["wandb"] > committed
        if committed >= 2 * EVERY and held["mlflow"] > committed and (wandb_past or held["mlflow"] >= MAX_STEPS - 10):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return {**_held(job, tmp), "waited_for_wandb": wandb_past}
        if proc.poll() is not None:
            raise AssertionError(f"rentune exited ({proc.returncode}) before the kill:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint past step {2 * EVERY} with steps logged after it in {timeout} s")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def tracked_job(tmp_path_factory, tiny_model, s3_server):
    tmp = tmp_path_factory.mktemp("tracking")
    mlruns = tmp / "mlruns"
    bucket = create_bucket(s3_server)
    # deterministic: the resumed attempt recomputes the killed one's last steps bit for bit, so trackers that
    # kept the first values (MLflow, W&B) and the one that takes the replay (TensorBoard) agree exactly.
    training = {
        "max_steps": MAX_STEPS,
        "seed": 7,
        "deterministic": True,
        "checkpoint": {"every_steps": EVERY, "keep": 2},
    }
    spec = tiny_job(
        JOB,
        tiny_model,
        training=training,
        store=s3_section(s3_server, bucket),
        tracking={
            "tensorboard": True,
            "mlflow": {"tracking_uri": mlruns.as_uri()},
            "wandb": {"project": "rentune-tests"},
        },
        experiments=[
            {
                "id": "lower-lr",
                "changes": ["training.learning_rate", "training.max_steps"],
                "rationale": "a smaller step size",
                "training": {"learning_rate": 0.002, "max_steps": 20},
            }
        ],
    )
    spec_path = write_spec(tmp / "spec.yaml", spec)
    env = _env(tmp)
    job = PrefixedStore(
        S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=s3_server, addressing_style="path"), f"jobs/{JOB}"
    )
    first = start_run(spec_path, tmp / "node-a", env)
    killed = _kill_after_checkpoint_and_more_steps(job, first, tmp)
    killed["out"] = first.stdout.read()
    second = start_run(spec_path, tmp / "node-b", env)  # nothing local survives but the W&B volume
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-4000:]
    fetched = tmp / "fetched"
    store_flags = ("--store", f"s3://{bucket}/runs", "--endpoint-url", s3_server)
    fetch = rentune("fetch", JOB, *store_flags, "--dest", str(fetched), env=env)
    assert fetch.returncode == 0, fetch.stderr
    status = rentune("status", JOB, *store_flags, env=env)
    assert status.returncode == 0, status.stderr
    return {
        "status": status.stdout,
        "job": job,
        "out": out,
        "mlruns": mlruns,
        "tmp": tmp,
        "killed": killed,
        "fetched": fetched,
    }


def _result(job, trial: str) -> dict:
    return json.loads(job.get_bytes(f"trials/{trial}/result.json"))


def _ids(job, trial: str) -> dict:
    return json.loads(job.get_bytes(f"trials/{trial}/tracking.json"))


def test_the_resume_happened_after_the_trackers_had_logged_past_the_checkpoint(tracked_job):
    result, killed = _result(tracked_job["job"], "main"), tracked_job["killed"]
    assert result["resumed_from_step"] == killed["committed"]  # measured once the process was dead
    # The steps after it were logged by the killed attempt and trained again by the resumed one.
    assert killed["mlflow"] > result["resumed_from_step"]
    if killed["waited_for_wandb"]:  # else the kill came late in the run, before W&B wrote a block past it
        assert killed["wandb"] > result["resumed_from_step"]  # on disk in W&B's offline file
    assert "tracking: mlflow: continuing run" in tracked_job["out"]
    assert "tracking: wandb: started run" in tracked_job["killed"]["out"]
    for out in (tracked_job["killed"]["out"], tracked_job["out"]):
        assert "tracking: warning" not in out


def test_status_shows_each_trials_runs(tracked_job):
    for trial in ("main", "lower-lr"):
        ids = _ids(tracked_job["job"], trial)
        assert f"mlflow run {ids['mlflow']['run_id']} (experiment rentune/{JOB})" in tracked_job["status"]
        assert f"wandb run rentune-tests/{ids['wandb']['id']}" in tracked_job["status"]
        assert f"tensorboard trials/{trial}/tensorboard/" in tracked_job["status"]


def test_every_checkpoint_manifest_carries_the_run_ids(tracked_job):
    job = tracked_job["job"]
    ids = _ids(job, "main")
    steps = list_steps(job, checkpoint_prefix("main"))
    assert steps
    for step in steps:
        manifest = json.loads(job.get_bytes(f"{checkpoint_prefix('main')}/step-{step:08d}/{MANIFEST}"))
        assert manifest["tracking"]["mlflow"]["run_id"] == ids["mlflow"]["run_id"]
        assert manifest["tracking"]["wandb"]["id"] == ids["wandb"]["id"]


def test_tensorboard_holds_each_step_once_after_purging_the_killed_attempt(tracked_job):
    for trial, steps in (("main", MAX_STEPS), ("lower-lr", 20)):
        folder = tracked_job["fetched"] / "tensorboard" / trial
        assert len(list(folder.glob("events.out.tfevents.*"))) >= (3 if trial == "main" else 2)  # per process
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        logged = [e.step for e in events.Scalars("train/loss")]
        assert logged == list(range(1, steps + 1)), f"{trial}: {logged}"
        assert sorted({e.step for e in events.Scalars("train/learning_rate")}) == list(range(1, steps + 1))
        assert [e.step for e in events.Scalars("eval/loss")] == sorted({e.step for e in events.Scalars("eval/loss")})
        assert events.Scalars("train/memory_gb")[-1].value > 0
        assert events.Scalars("train/tokens_per_s")  # one per progress window
        assert events.Scalars("eval/accuracy")[0].step == steps  # the report phase's results
        assert events.Scalars("baseline/accuracy")


def _mlflow(tracked_job, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracked_job["mlruns"].as_uri())


def test_mlflow_has_one_finished_run_per_trial_with_each_step_once(tracked_job, monkeypatch):
    client = _mlflow(tracked_job, monkeypatch)
    experiment = client.get_experiment_by_name(f"rentune/{JOB}")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["rentune.trial_id"] for r in runs) == ["lower-lr", "main"]
    job = tracked_job["job"]
    for run in runs:
        trial = run.data.tags["rentune.trial_id"]
        assert run.info.run_id == _ids(job, trial)["mlflow"]["run_id"]
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert sorted(steps) == list(range(1, _result(job, trial)["steps"] + 1)), f"{trial}: {sorted(steps)}"
        assert run.data.params["training.learning_rate"] == str(0.005 if trial == "main" else 0.002)
        assert run.data.params["rentune.data_version"]
        assert "eval/accuracy" in run.data.metrics and "baseline/accuracy" in run.data.metrics
        assert run.data.tags["rentune.status"] == "completed"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "rentune")}
        assert {"rentune/report.md", "rentune/loss_curves.png", "rentune/spec.json"} <= artifacts
    selected = [r for r in runs if r.data.tags["rentune.selected"] == "True"]
    assert len(selected) == 1
    tags = selected[0].data.tags
    assert tags["rentune.verdict.test.hypothesis"] in ("holds", "does not hold", "inconclusive")
    evaluated = json.loads(job.get_bytes("phases/evaluate/result.json"))["trials"]
    assert tags["rentune.eval.hypothesis"] == evaluated[tags["rentune.trial_id"]]["hypothesis"]["result"]
    assert {"eval/gain", "eval/gain_low", "eval/gain_high"} <= set(selected[0].data.metrics)


def test_wandb_offline_holds_one_run_per_trial_with_each_step_once(tracked_job):
    volume = tracked_job["tmp"] / "wandb-volume" / "wandb"
    job = tracked_job["job"]
    for trial in ("main", "lower-lr"):
        run_id = _ids(job, trial)["wandb"]["id"]
        files = sorted(volume.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
        assert len(files) >= (3 if trial == "main" else 2)  # killed attempt, resumed attempt, report
        rows = [row for path in files for row in history(path)]
        steps = [row["_step"] for row in rows if "train/loss" in row]
        assert steps == list(range(1, _result(job, trial)["steps"] + 1)), f"{trial}: {steps}"
        assert any("eval/accuracy" in row for row in rows)


def test_the_three_trackers_agree_on_every_step_loss(tracked_job, monkeypatch):
    client = _mlflow(tracked_job, monkeypatch)
    job = tracked_job["job"]
    mlflow = {m.step: m.value for m in client.get_metric_history(_ids(job, "main")["mlflow"]["run_id"], "train/loss")}
    events = EventAccumulator(str(tracked_job["fetched"] / "tensorboard" / "main"), size_guidance={"scalars": 0})
    events.Reload()
    tensorboard = {e.step: e.value for e in events.Scalars("train/loss")}
    run_id = _ids(job, "main")["wandb"]["id"]
    volume = tracked_job["tmp"] / "wandb-volume" / "wandb"
    wandb = {
        row["_step"]: row["train/loss"]
        for path in sorted(volume.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
        for row in history(path)
        if "train/loss" in row
    }
    assert mlflow.keys() == tensorboard.keys() == wandb.keys()
    for step, loss in mlflow.items():
        assert tensorboard[step] == pytest.approx(loss, rel=1e-6)  # TensorBoard keeps float32
        assert wandb[step] == loss
    # The result's loss windows come from the Trainer's log of the whole run: the trackers logged the same.
    start = 0
    for window in _result(job, "main")["losses"]:
        losses = [mlflow[step] for step in range(start + 1, window["step"] + 1)]
        assert sum(losses) / len(losses) == pytest.approx(window["loss"], rel=1e-9)
        start = window["step"]
