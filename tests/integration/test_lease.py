"""The lease is enforced with an injected clock (no sleeping): a lease that ends mid-training stops the
training at the plan's deadline with a checkpoint, the job still verifies (in a fresh process) and exports,
and the report says training was cut short. Then `check-export` accepts the true base model and refuses
one with a single changed byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from entrypoint.runner import run_job
from entrypoint.store import FileStore
from tests.models import build_tiny_bert
from tests.specs import load, tiny_job

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"
LEASE_START = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)
MAX_STEPS = 120


class FakeClock:
    """Wall-clock time that moves one hour every time it is read: training reads it once per step, so the
    3-day lease runs out after a few dozen steps of a tiny model."""

    def __init__(self, start: float, tick: float = 3600.0):
        self.now, self.tick, self.reads = start, tick, 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.tick
        return self.now


@pytest.fixture(scope="module")
def cut_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lease")
    model = build_tiny_bert(tmp / "bert")
    spec = tiny_job(
        "lease",
        model,
        training={"max_steps": MAX_STEPS},
        rental={"window": "3d", "started_at": LEASE_START.isoformat(), "margin": "2h"},
        experiments=[
            {
                "id": "lr-low",
                "changes": ["training.learning_rate"],
                "rationale": "r",
                "training": {"learning_rate": 0.001},
            }
        ],
    )
    loaded = load(spec)
    clock = FakeClock(LEASE_START.timestamp())
    lines: list[str] = []
    outcome = run_job(loaded, FileStore(tmp / "store"), tmp / "work", lines.append, clock=clock)
    return tmp, model, tmp / "store/jobs/lease", outcome, lines


def _json(path: Path):
    return json.loads(path.read_text())


def test_training_stops_at_the_deadline_and_the_job_still_verifies_and_exports(cut_job):
    _, _, job, outcome, lines = cut_job
    assert outcome.ran == ["data", "baseline", "probe", "train", "evaluate", "test", "verify", "report", "export"]
    plan = _json(job / "plan.json")
    main = _json(job / "trials/main/result.json")
    assert main["status"] == "stopped" and "cut short at the plan's training deadline" in main["reason"]
    assert 0 < main["steps"] < MAX_STEPS and main["budget"]["status"] == "short"
    # the clock moves 1 h per step: training stopped at the first step at or past the deadline
    assert any(f"stopping at step {main['steps']}" in line for line in lines)
    manifest = job / f"trials/main/checkpoints/step-{main['steps']:08d}/MANIFEST.json"
    assert manifest.is_file()  # the weights at the deadline were committed
    assert plan["train_deadline_at"] < plan["lease_end_at"] - 2 * 3600  # margin and final phases kept free

    variant = _json(job / "trials/lr-low/result.json")
    assert variant["status"] == "stopped" and variant["reason"].startswith("not started")
    verify = _json(job / "phases/verify/result.json")
    assert verify["checkpoint_step"] == main["steps"] and verify["outputs_equal"]
    assert verify["fresh_process_pid"] != os.getpid()
    assert _json(job / "export/BINDING.json")["trial_id"] == "main"
    results = _json(job / "report/results.json")
    assert [t["status"] for t in results["trials"]] == ["stopped", "stopped"]
    notes = " ".join(results["limitations"])
    assert "cut short at the plan's training deadline" in notes and "lr-low is stopped: not started" in notes
    assert "cut short" in (job / "report/report.md").read_text()


def test_status_shows_phases_trials_and_attempts(cut_job):
    tmp, _, _, _, _ = cut_job
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    shown = subprocess.run(
        [RENTUNE, "status", "lease", "--store", f"file://{tmp / 'store'}"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "lease 3d: ends in" in out and "training deadline in" in out
    # elapsed, when the job ended by the newest plan revision, and what was left before the lease end
    assert "elapsed " in out and "; ended " in out and "left before the lease ends, the 2h00 margin included" in out
    table = out.split("plan against actual:\n")[1]
    assert any(line.startswith("  main ") for line in table.splitlines())  # planned against actual, per trial
    for phase in ("data", "train", "verify", "export"):
        assert any(line.startswith(phase) and "committed" in line for line in out.splitlines()), phase
    assert any(line.startswith("main") and "stopped" in line for line in out.splitlines())
    assert "1: started 2026-11-30 10:00 UTC, completed" in out  # 2nd reading (the 1st: plan check of a new job)


def test_check_export_accepts_the_true_base_and_refuses_one_changed_byte(cut_job, tmp_path):
    _, model, job, _, _ = cut_job
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def check_export(base: Path) -> subprocess.CompletedProcess:
        command = [RENTUNE, "check-export", str(job / "export"), "--base", str(base)]
        return subprocess.run(command, env=env, capture_output=True, text=True)

    accepted = check_export(model)
    assert accepted.returncode == 0 and accepted.stdout.startswith("OK "), accepted.stderr
    tampered = tmp_path / "bert"
    shutil.copytree(model, tampered)
    weights = tampered / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    refused = check_export(tampered)
    assert refused.returncode == 2
    assert "refused" in refused.stderr and "files that differ: model.safetensors" in refused.stderr


def _check_export(export: Path, base: Path) -> subprocess.CompletedProcess:
    command = [RENTUNE, "check-export", str(export), "--base", str(base)]
    return subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)


@pytest.mark.parametrize(
    "damage",
    ["adapter-byte", "tokenizer-byte", "spec-byte", "added-file", "removed-file"],
)
def test_check_export_refuses_an_export_whose_files_changed(cut_job, tmp_path, damage):
    """BINDING.json holds the sha256 of every exported file: one flipped byte anywhere is refused."""
    _, model, job, _, _ = cut_job
    export = shutil.copytree(job / "export", tmp_path / "export")
    binding = _json(export / "BINDING.json")
    assert {"adapter/adapter_model.safetensors", "adapter/tokenizer.json", "spec.yaml"} <= set(binding["files"])
    target = {
        "adapter-byte": "adapter/adapter_model.safetensors",
        "tokenizer-byte": "adapter/tokenizer.json",
        "spec-byte": "spec.yaml",
        "added-file": "adapter/extra.safetensors",
        "removed-file": "adapter/adapter_config.json",
    }[damage]
    path = export / target
    if damage == "added-file":
        path.write_bytes(b"not part of the export")
    elif damage == "removed-file":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    refused = _check_export(export, model)
    assert refused.returncode == 2, refused.stdout
    assert f"refused: {path}:" in refused.stderr


@pytest.mark.parametrize(
    "binding", [b"[1]", b'{"base_model": {}}', b'{"files": [1], "base_model": {}}', b'{"trial_id": "ma']
)
def test_check_export_names_an_unreadable_binding(cut_job, tmp_path, binding):
    _, model, job, _, _ = cut_job
    export = shutil.copytree(job / "export", tmp_path / "export")
    (export / "BINDING.json").write_bytes(binding)
    refused = _check_export(export, model)
    assert refused.returncode == 2
    assert f"{export / 'BINDING.json'}:" in refused.stderr and "expected" in refused.stderr
    assert "Traceback" not in refused.stderr
