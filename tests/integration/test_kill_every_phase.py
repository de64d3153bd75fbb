"""SIGKILL the runner once inside every phase in turn (a real `rentune` process, killed the moment it
announces the phase, or a few steps into training); each time a fresh process continues the job, and the
final results equal those of an uninterrupted run of the same spec: metrics, selection, train_loss and
the loss history, and the exported weights, byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from entrypoint.runner import PHASES
from entrypoint.store.base import TMP_PREFIX
from tests.models import build_tiny_bert
from tests.specs import tiny_job, write_spec

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"


def _spec(tmp: Path, model: Path) -> Path:
    spec = tiny_job(
        "killed",
        model,
        guardrails=[{"metric": "f1/*", "tolerance": 1.0}],
        training={
            "max_steps": 40,
            "seed": 5,
            "deterministic": True,
            "log_every_steps": 4,  # the loss window of steps 9-12 spans the resume from step 10
            "checkpoint": {"every_steps": 10, "keep": 2},
        },
        adaptation={"target_modules": ["query", "key", "value", "dense"]},  # a set inside peft: order varies
        experiments=[{"id": "r2", "changes": ["adaptation.rank"], "rationale": "smaller", "adaptation": {"rank": 2}}],
    )
    return write_spec(tmp / "spec.yaml", spec)


def _run(spec: Path, store: Path, work: Path, kill_at: str | None = None) -> tuple[int, list[str]]:
    """Run rentune; with `kill_at`, SIGKILL it as soon as a line starting with that text is printed."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [RENTUNE, "run", str(spec), "--store", f"file://{store}", "--workdir", str(work)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if kill_at is not None and line.startswith(kill_at):
            proc.send_signal(signal.SIGKILL)
            break
    proc.stdout.close()
    return proc.wait(timeout=600), lines


def _final(job: Path) -> dict:
    results = json.loads((job / "report/results.json").read_text())
    binding = json.loads((job / "export/BINDING.json").read_text())
    # What the store holds: a write killed mid-way may leave a temporary file, which the store never lists
    exported = sorted(
        p for p in (job / "export/adapter").rglob("*") if p.is_file() and not p.name.startswith(TMP_PREFIX)
    )
    return {
        # the same weights export byte-identical files: no pickled work dir, target_modules in one order
        "export_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in exported},
        "bound_files": {name: info for name, info in binding["files"].items() if name.startswith("adapter/")},
        "selected": results["selected"],
        "trials": {t["id"]: (t["status"], t["steps"], t["metrics"], t["losses"]) for t in results["trials"]},
        "test": (results["test"]["baseline"], results["test"]["trial"]),
        "verdict": results["verdict"],  # the intervals too: the bootstrap's seed is fixed, resumed or not
        "comparisons": {t["id"]: (t["comparison"], t["changed"]) for t in results["trials"]},
        "test_comparison": (results["test"]["comparison"], results["test"]["changed"]),
        "power": results["power"],
        "runner_up": results["selected"]["runner_up"],
        "adapter": (job / "export/adapter/adapter_model.safetensors").read_bytes(),
        "binding_trial": json.loads((job / "export/BINDING.json").read_text())["trial_id"],
        "train_loss": {
            t: json.loads((job / f"trials/{t}/result.json").read_text())["train_loss"] for t in ("main", "r2")
        },
    }


def test_sigkill_inside_every_phase_then_a_fresh_process_finishes_the_same_job(tmp_path):
    model = build_tiny_bert(tmp_path / "bert")
    spec = _spec(tmp_path, model)
    code, lines = _run(spec, tmp_path / "reference", tmp_path / "work-ref")
    assert code == 0, "\n".join(lines[-40:])
    reference = _final(tmp_path / "reference/jobs/killed")
    assert "adapter_config.json" in reference["export_sha256"] and "training_args.bin" not in reference["export_sha256"]

    store, job = tmp_path / "store", tmp_path / "store/jobs/killed"
    for n, (phase, _) in enumerate(PHASES):
        kill_at = "train: step 16/" if phase == "train" else f"{phase}: starting"
        code, lines = _run(spec, store, tmp_path / f"node-{n}", kill_at=kill_at)  # a new node each time
        assert code == -signal.SIGKILL, f"{phase}: the run ended before it was killed:\n" + "\n".join(lines[-20:])
        assert not (job / f"phases/{phase}/result.json").exists(), f"killed after {phase} committed"
        assert not (job / f"attempts/{n + 1}/ended.json").exists()  # SIGKILL leaves no end record
        assert all(
            (job / f"phases/{done}/result.json").exists()
            for done, _ in PHASES[: PHASES.index((phase, _)) if False else n]
        )
    code, lines = _run(spec, store, tmp_path / "node-last")
    assert code == 0, "\n".join(lines[-40:])
    assert "train: resuming from committed checkpoint step" not in "\n".join(lines)  # train finished earlier
    assert f"attempt {len(PHASES)} ended killed" in "\n".join(lines)
    assert _final(job) == reference
