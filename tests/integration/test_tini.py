"""The container's signal path without Docker: `tini -g -- rentune run ...` (the images' ENTRYPOINT), and
SIGTERM to tini alone, as `docker stop` sends it to PID 1. tini forwards it to rentune's process group;
rentune finishes its step, commits a checkpoint and exits 143, which tini passes on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models import build_tiny_bert
from tests.specs import tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINI = shutil.which("tini", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(TINI is None, reason="tini is not installed (make setup puts Debian's tini into .venv/bin)")
def test_sigterm_to_tini_reaches_rentune_which_commits_and_exits_143(tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    training = {
        "max_steps": 100000,  # never finishes on its own
        "log_every_steps": 5,
        "checkpoint": {"every_steps": 1000, "grace_seconds": 60},
    }
    path = write_spec(tmp_path / "spec.yaml", tiny_job("tini", model, training=training))
    store = tmp_path / "store"
    command = [TINI, "-g", "--", str(BIN / "rentune"), "run", str(path), "--store", f"file://{store}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, like a container
    )  # fmt: skip
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("train: step 20/"):
            os.kill(proc.pid, signal.SIGTERM)  # to tini only, as docker stop does
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=120) == 143, "".join(lines[-30:])
    out = "".join(lines)
    assert "SIGTERM received" in out and "checkpoint: committed step" in out
    steps = sorted((store / "jobs/tini/trials/main/checkpoints").glob("step-*/MANIFEST.json"))
    assert len(steps) == 1 and int(steps[0].parent.name[5:]) >= 20  # committed after the signal, not before
    ended = json.loads((store / "jobs/tini/attempts/1/ended.json").read_text())
    assert ended["outcome"] == "interrupted"
