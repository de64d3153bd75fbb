"""Two processes through torchrun on CPU (gloo): train a tiny model, commit checkpoints from rank 0 only,
stop on SIGTERM (forwarded by rentune to torchrun and its workers), and resume in a fresh launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.models import build_tiny_bert
from tests.specs import tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "m")


def _spec(tmp_path: Path, model: Path, distribution: dict) -> Path:
    spec = tiny_job(
        "dist",
        model,
        training={
            "max_steps": 150,
            "microbatch": 4,
            "log_every_steps": 10,
            "checkpoint": {"every_steps": 10, "keep": 2},
        },
        distribution=distribution,
        store={"uri": f"file://{tmp_path / 'store'}"},
    )
    return write_spec(tmp_path / "spec.yaml", spec)


def _start(spec: Path, workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [RENTUNE, "run", str(spec), "--workdir", str(workdir), "--until", "train"],
        cwd=spec.parent,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize(
    "distribution",
    [
        {"strategy": "ddp", "nproc_per_node": 2},
        {"strategy": "deepspeed", "nproc_per_node": 2, "zero_stage": 2},
    ],
    ids=["ddp", "deepspeed-zero2"],
)
def test_two_processes_checkpoint_stop_and_resume_in_a_fresh_launch(tmp_path, bert, distribution):
    spec = _spec(tmp_path, bert, distribution)
    checkpoints = tmp_path / "store/jobs/dist/trials/main/checkpoints"
    first = _start(spec, tmp_path / "node-a")
    deadline = time.monotonic() + 300
    while not (checkpoints / "step-00000020/MANIFEST.json").exists():
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 143, out[-3000:]
    assert "forwarding to the torchrun workers" in out
    manifests = sorted(checkpoints.glob("step-*/MANIFEST.json"))
    stopped_at = json.loads(manifests[-1].read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(stopped_at["files"])  # rank 0 waited for rank 1
    assert stopped_at["step"] < 150

    second = _start(spec, tmp_path / "node-b")
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "store/jobs/dist/trials/main/result.json").read_text())
    assert result["world_size"] == 2 and result["launcher"] == "torchrun"
    assert result["resumed_from_step"] == stopped_at["step"] and result["steps"] == 150
    assert (tmp_path / "store/jobs/dist/trials/main/final/adapter_model.safetensors").exists()
