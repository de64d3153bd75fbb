"""Interrupted training resumes exactly, in a fresh process with an empty work dir, from a real S3 server.

The job trains a tiny BERT (built from a config, saved, loaded back with `from_pretrained`) so that the
run is long enough in steps to be interrupted, yet takes seconds. Processes are real `rentune` processes.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from entrypoint.store import PrefixedStore, get_tree
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix, find_latest, list_steps
from entrypoint.store.s3 import S3Store
from tests.metadata_server import FakeMetadata
from tests.models import build_tiny_bert
from tests.processes import rentune, start_run
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 60
EVERY = 10
LOG_EVERY = 7  # loss windows that do not line up with checkpoints: the window around the resume spans both


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def _spec(tmp_path: Path, model: Path, endpoint: str, bucket: str) -> Path:
    training = {
        "max_steps": MAX_STEPS,
        "seed": 7,
        "deterministic": True,
        "log_every_steps": LOG_EVERY,
        "checkpoint": {"every_steps": EVERY, "keep": 3, "grace_seconds": 60},
    }
    return write_spec(
        tmp_path / "spec.yaml", tiny_job("resume", model, training=training, store=s3_section(endpoint, bucket))
    )


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _job(endpoint: str, bucket: str) -> PrefixedStore:
    return PrefixedStore(
        S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=endpoint, addressing_style="path"), "jobs/resume"
    )


def _wait_for_manifest(job, proc: subprocess.Popen, step: int, timeout: float = 300) -> None:
    key = f"{checkpoint_prefix('main')}/step-{step:08d}/{MANIFEST}"
    deadline = time.monotonic() + timeout
    while job.head(key) is None:
        if proc.poll() is not None:
            raise AssertionError(f"rentune exited ({proc.returncode}) before step {step}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint at step {step} after {timeout} s")
        time.sleep(0.02)


def _final_weights(job, tmp: Path) -> dict:
    folder = get_tree(job, "trials/main/final", tmp / "final")
    return load_file(folder / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model, s3_server):
    """An uninterrupted run: its final weights, train_loss and loss history are what a resumed run must
    reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    bucket = create_bucket(s3_server)
    (tmp / "work").mkdir()
    code, out = _finish(start_run(_spec(tmp, tiny_model, s3_server, bucket), tmp / "work"))
    assert code == 0, out[-4000:]
    job = _job(s3_server, bucket)
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert [e["step"] for e in result["losses"]] == [*range(LOG_EVERY, MAX_STEPS, LOG_EVERY), MAX_STEPS]
    assert result["train_loss"] > 0
    return _final_weights(job, tmp), result["losses"], result["train_loss"]


def test_sigkill_then_fresh_process_resumes_bit_exact(tmp_path, tiny_model, s3_server, reference):
    bucket = create_bucket(s3_server)
    spec = _spec(tmp_path, tiny_model, s3_server, bucket)
    job = _job(s3_server, bucket)
    (tmp_path / "node-a").mkdir()
    first = start_run(spec, tmp_path / "node-a")
    _wait_for_manifest(job, first, 2 * EVERY)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert json.loads(job.get_bytes("attempts/1/started.json"))
    assert job.head("phases/train/result.json") is None

    (tmp_path / "node-b").mkdir()  # another "node": nothing local survives
    code, out = _finish(start_run(spec, tmp_path / "node-b"))
    assert code == 0, out[-4000:]
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert result["resumed_from_step"] is not None and 2 * EVERY <= result["resumed_from_step"] < MAX_STEPS
    assert "train: resuming from committed checkpoint step" in out
    ref_weights, ref_losses, ref_train_loss = reference
    weights = _final_weights(job, tmp_path)
    assert weights.keys() == ref_weights.keys()
    mismatched = [name for name in weights if not (weights[name] == ref_weights[name]).all()]
    assert not mismatched, f"weights differ from the uninterrupted run: {mismatched[:5]}"
    assert result["losses"] == ref_losses  # the window around the resume included
    assert result["train_loss"] == ref_train_loss


def test_sigkill_after_the_last_step_s_checkpoint_resumes_without_stepping_past_max_steps(
    tmp_path, tiny_model, s3_server, reference
):
    bucket = create_bucket(s3_server)
    spec = _spec(tmp_path, tiny_model, s3_server, bucket)
    job = _job(s3_server, bucket)
    first = start_run(spec, tmp_path / "node-a")
    _wait_for_manifest(job, first, MAX_STEPS)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert job.head("trials/main/result.json") is None, "killed too late: the trial had finished"

    code, out = _finish(start_run(spec, tmp_path / "node-b"))
    assert code == 0, out[-4000:]
    assert f"train: resuming from committed checkpoint step {MAX_STEPS}" in out
    assert f"train: step {MAX_STEPS + 1}/" not in out
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert result["steps"] == MAX_STEPS and max(list_steps(job, checkpoint_prefix("main"))) == MAX_STEPS
    ref_weights, ref_losses, ref_train_loss = reference
    weights = _final_weights(job, tmp_path)
    assert all((weights[name] == ref_weights[name]).all() for name in ref_weights)
    assert result["losses"] == ref_losses


def test_a_resume_refuses_a_trial_that_a_live_process_still_writes(tmp_path, tiny_model, s3_server):
    """The trial's progress record names a writer that still runs on this node (here: this test's own
    process, standing in for an orphaned rank): the resume refuses with exit 3 rather than train beside it."""
    import os
    import socket

    import psutil

    bucket = create_bucket(s3_server)
    spec = _spec(tmp_path, tiny_model, s3_server, bucket)
    job = _job(s3_server, bucket)
    first = start_run(spec, tmp_path / "node-a")
    _wait_for_manifest(job, first, EVERY)
    while job.head("trials/main/progress.json") is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    progress = json.loads(job.get_bytes("trials/main/progress.json"))
    assert progress["writer"]["pid"] != os.getpid()  # the killed process's
    me = psutil.Process()
    progress["writer"] = {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}
    job.put_bytes("trials/main/progress.json", json.dumps(progress).encode())

    code, out = _finish(start_run(spec, tmp_path / "node-b"))
    assert code == 3, out[-3000:]
    assert f"train: trial main is still being trained by process {me.pid} on {socket.gethostname()}" in out


def test_sigterm_commits_or_leaves_nothing_and_exits_143(tmp_path, tiny_model, s3_server, reference):
    bucket = create_bucket(s3_server)
    spec = _spec(tmp_path, tiny_model, s3_server, bucket)
    job = _job(s3_server, bucket)
    (tmp_path / "node-a").mkdir()
    proc = start_run(spec, tmp_path / "node-a")
    _wait_for_manifest(job, proc, EVERY)
    proc.send_signal(signal.SIGTERM)
    code, out = _finish(proc)
    assert code == 143, out[-4000:]
    assert "SIGTERM received" in out
    ended = json.loads(job.get_bytes("attempts/1/ended.json"))
    assert ended["outcome"] == "interrupted" and ended["phase"] == "train"
    prefix = checkpoint_prefix("main")
    for step, names in list_steps(job, prefix).items():
        if MANIFEST in names:  # committed: complete and verifiable
            manifest = json.loads(job.get_bytes(f"{prefix}/step-{step:08d}/{MANIFEST}"))
            assert set(manifest["files"]) | {MANIFEST} == names
    newest = find_latest(job, prefix, tmp_path / "check", lambda m: None)
    assert newest is not None and newest.step >= EVERY
    # The step SIGTERM arrived in was finished and committed (it is not a multiple of EVERY in general).
    assert f"checkpoint: committed step {newest.step}" in out and "after SIGTERM" in out

    # The newest checkpoint claims another software stack, as if written on another node image.
    key = f"{prefix}/step-{newest.step:08d}/{MANIFEST}"
    manifest = json.loads(job.get_bytes(key))
    job.put_bytes(key, json.dumps({**manifest, "env": {**manifest["env"], "torch": "0.0-other-node"}}).encode())

    (tmp_path / "node-b").mkdir()
    code, out = _finish(start_run(spec, tmp_path / "node-b"))
    assert code == 0, out[-4000:]
    ref_weights, ref_losses, ref_train_loss = reference
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert result["losses"] == ref_losses and result["train_loss"] == ref_train_loss
    assert result["platform_change"]["checkpoint"]["torch"] == "0.0-other-node" and "platform change" in out
    # the report tells the interruption: each attempt, and where the trial's training resumed
    report = job.get_bytes("report/report.md").decode()
    assert "## Attempts: interruptions and resumes" in report
    assert "| 1 | interrupted | train | Interrupted: train: stopped on SIGTERM at step" in report
    resumed = result["interruptions"][-1]["resumed_from_step"]
    assert resumed == newest.step and f"the next resumed from committed step {resumed}:" in report
    weights = _final_weights(job, tmp_path)
    assert all((weights[name] == ref_weights[name]).all() for name in ref_weights)


def test_ctrl_c_commits_its_step_exits_130_and_the_printed_command_resumes_there(tmp_path, tiny_model, s3_server):
    """Ctrl-C (SIGINT, as tini forwards it from `docker run -it`) during training is a SIGTERM: the step in
    progress is finished and committed, the process exits 130 (not click's "Aborted!", exit 1), the attempt
    is recorded as interrupted, and the command it prints resumes from that very step."""
    bucket = create_bucket(s3_server)
    spec = _spec(tmp_path, tiny_model, s3_server, bucket)
    job = _job(s3_server, bucket)
    proc = start_run(spec, tmp_path / "node-a", None, "--until", "train")
    _wait_for_manifest(job, proc, EVERY)
    proc.send_signal(signal.SIGINT)
    code, out = _finish(proc)
    assert code == 130, out[-4000:]
    assert "train: SIGINT (Ctrl-C) received during step" in out and "Aborted!" not in out
    ended = json.loads(job.get_bytes("attempts/1/ended.json"))
    assert ended["outcome"] == "interrupted" and ended["phase"] == "train", ended
    kept = find_latest(job, checkpoint_prefix("main"), tmp_path / "check", lambda m: None)
    assert kept is not None and kept.step < MAX_STEPS
    assert f"checkpoint: committed step {kept.step}" in out and "s after SIGINT (Ctrl-C)" in out
    assert f"step {kept.step} is committed and the next run resumes from it" in out
    again = out.split("to continue, run the same command again: ")[1].splitlines()[0]
    command = shlex.split(again)
    assert command[0] == "rentune" and command[1:] == ["run", str(spec), "--workdir", str(tmp_path / "node-a"),
                                                       "--until", "train"]  # fmt: skip
    resumed = rentune(*command[1:], timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-2000:]
    assert f"train: resuming from committed checkpoint step {kept.step} " in resumed.stdout


def test_interruption_notice_commits_at_once_exits_143_and_resumes_exact(tmp_path, tiny_model, s3_server, reference):
    """A provider's notice (AWS's spot/instance-action, from a fake metadata server on 127.0.0.1) raised
    mid-training: the step in progress is finished and committed within 2 s of the notice, the process exits
    143, and a fresh process on an empty work dir ends with the uninterrupted run's weights."""
    bucket = create_bucket(s3_server)
    spec = _spec(tmp_path, tiny_model, s3_server, bucket)
    job = _job(s3_server, bucket)
    prefix = checkpoint_prefix("main")
    with FakeMetadata() as metadata:
        env = {
            "RENTUNE_INTERRUPTION_NOTICE": "aws",
            "RENTUNE_METADATA_URL": metadata.url,
            "RENTUNE_NOTICE_POLL_SECONDS": "0.2",
        }
        proc = start_run(spec, tmp_path / "node-a", env)
        _wait_for_manifest(job, proc, EVERY)
        metadata.raise_spot_notice(lead_seconds=120)
        code, out = _finish(proc)
    assert code == 143, out[-4000:]
    assert f"notices: watching aws's interruption notices at {metadata.url} every 0.2 s" in out
    assert "notices: interruption notice from aws spot/instance-action: terminate at " in out
    assert " s ahead); stopping as on SIGTERM" in out
    ended = json.loads(job.get_bytes("attempts/1/ended.json"))
    assert ended["outcome"] == "interrupted" and ended["phase"] == "train"

    # The step training was in when the notice arrived (k, from the log) is the one committed (or k + 1,
    # when the signal lands between a step's end and its check), within 2 s of the notice.
    during = int(out.split("train: SIGTERM received during step ")[1].split(";")[0])
    newest = find_latest(job, prefix, tmp_path / "check", lambda m: None)
    assert newest is not None and newest.step in (during, during + 1) and newest.step > EVERY, (during, newest)
    manifest = json.loads(job.get_bytes(f"{prefix}/step-{newest.step:08d}/{MANIFEST}"))
    took = manifest["committed_at"] - metadata.raised_at
    print(f"notice raised -> step {newest.step} committed: {took:.2f} s (seen during step {during})", file=sys.stderr)
    assert took <= 2.0, took
    assert f"checkpoint: committed step {newest.step}" in out

    # an empty work dir, no notices; the weights are the train phase's (the later phases: the tests above)
    code, out = _finish(start_run(spec, tmp_path / "node-b", None, "--until", "train"))
    assert code == 0, out[-4000:]
    assert f"train: resuming from committed checkpoint step {newest.step}" in out
    ref_weights, ref_losses, ref_train_loss = reference
    result = json.loads(job.get_bytes("trials/main/result.json"))
    assert result["losses"] == ref_losses and result["train_loss"] == ref_train_loss
    weights = _final_weights(job, tmp_path)
    assert weights.keys() == ref_weights.keys()
    assert all((weights[name] == ref_weights[name]).all() for name in ref_weights)
