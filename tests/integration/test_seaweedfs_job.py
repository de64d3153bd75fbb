"""A whole job against SeaweedFS, an S3-compatible server that is not moto: a real `rentune` process is
SIGKILLed during training once it has committed a checkpoint there, a fresh process on a fresh work dir
finishes the job, and the trained weights, train_loss and logged loss history equal those of an uninterrupted run.

Like tests/integration/test_resume.py, but shorter: the uninterrupted reference stops after training
(`--until train`, all that is compared), and only the resumed run goes through every phase.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from entrypoint.store import PrefixedStore, get_tree
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix
from entrypoint.store.s3 import S3Store
from tests.models import build_tiny_bert
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec

RENTUNE = Path(sys.executable).parent / "rentune"
JOB_ID = "seaweed"
MAX_STEPS = 20  # a checkpoint at 10, the kill after it, and 10 more steps for the resumed run
EVERY = 10
LOG_EVERY = 3  # the loss window of steps 10-12 spans the resume from step 10


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def _spec(tmp_path: Path, model: Path, endpoint: str, bucket: str) -> Path:
    """The job, its store section on the SeaweedFS endpoint; `--store` picks the bucket of each run."""
    training = {
        "max_steps": MAX_STEPS,
        "seed": 7,
        "deterministic": True,
        "log_every_steps": LOG_EVERY,
        "checkpoint": {"every_steps": EVERY, "keep": 3, "grace_seconds": 60},
    }
    spec = tiny_job(JOB_ID, model, training=training, store=s3_section(endpoint, bucket))
    return write_spec(tmp_path / "spec.yaml", spec)


def _start(spec: Path, bucket: str, workdir: Path, *extra: str) -> subprocess.Popen:
    workdir.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [RENTUNE, "run", str(spec), "--store", f"s3://{bucket}/runs", "--workdir", str(workdir), *extra]
    return subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _job(endpoint: str, bucket: str) -> PrefixedStore:
    root = S3Store.from_uri(f"s3://{bucket}/runs", endpoint_url=endpoint, addressing_style="path")
    return PrefixedStore(root, f"jobs/{JOB_ID}")


def _wait_for_manifest(job: PrefixedStore, proc: subprocess.Popen, step: int, timeout: float = 300) -> None:
    key = f"{checkpoint_prefix('main')}/step-{step:08d}/{MANIFEST}"
    deadline = time.monotonic() + timeout
    while job.head(key) is None:
        if proc.poll() is not None:
            raise AssertionError(f"rentune exited ({proc.returncode}) before step {step}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint at step {step} after {timeout} s")
        time.sleep(0.02)


def _trained(job: PrefixedStore, tmp: Path) -> tuple[dict, dict]:
    """The main trial's result.json and its final adapter weights, read back from the store."""
    result = json.loads(job.get_bytes("trials/main/result.json"))
    folder = get_tree(job, "trials/main/final", tmp / "final")
    return result, load_file(folder / "adapter_model.safetensors")


def test_sigkill_on_seaweedfs_then_a_fresh_process_finishes_bit_exact(tmp_path, tiny_model, seaweed_server):
    ref_bucket, bucket = create_bucket(seaweed_server), create_bucket(seaweed_server)
    spec = _spec(tmp_path, tiny_model, seaweed_server, bucket)

    code, out = _finish(_start(spec, ref_bucket, tmp_path / "reference", "--until", "train"))
    assert code == 0, out[-4000:]
    ref_result, ref_weights = _trained(_job(seaweed_server, ref_bucket), tmp_path / "ref")
    assert [e["step"] for e in ref_result["losses"]] == [*range(LOG_EVERY, MAX_STEPS, LOG_EVERY), MAX_STEPS]

    job = _job(seaweed_server, bucket)
    first = _start(spec, bucket, tmp_path / "node-a")
    _wait_for_manifest(job, first, EVERY)
    first.send_signal(signal.SIGKILL)
    first.wait()
    first.stdout.close()
    assert json.loads(job.get_bytes("attempts/1/started.json"))
    assert job.head("phases/train/result.json") is None

    code, out = _finish(_start(spec, bucket, tmp_path / "node-b"))  # another "node": nothing local survives
    assert code == 0, out[-4000:]
    assert "train: resuming from committed checkpoint step" in out
    assert job.head("export/BINDING.json") is not None  # every phase ran to the end
    result, weights = _trained(job, tmp_path / "resumed")
    assert result["resumed_from_step"] is not None and EVERY <= result["resumed_from_step"] < MAX_STEPS
    assert weights.keys() == ref_weights.keys()
    mismatched = [name for name in weights if not (weights[name] == ref_weights[name]).all()]
    assert not mismatched, f"weights differ from the uninterrupted run: {mismatched[:5]}"
    assert result["losses"] == ref_result["losses"]
    assert result["train_loss"] == ref_result["train_loss"]
