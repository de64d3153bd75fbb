"""The commands a user runs from a laptop load neither torch nor transformers: each runs in a fresh
interpreter, and the modules it imported are inspected afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "jobspec/examples/quickstart.yaml")
HEAVY = ("torch", "transformers", "peft", "accelerate", "deepspeed")

# Runs the CLI in-process, then prints which heavy modules were imported (also when the command exits).
PROBE = """
import json, sys
from entrypoint.cli import main
try:
    main(sys.argv[1:], standalone_mode=True)
except SystemExit as stop:
    code = stop.code
heavy = sorted(name for name in {heavy!r} if name in sys.modules)
print("\\nLOADED " + json.dumps({{"heavy": heavy, "code": code}}))
"""


def _modules_loaded(*args: str, cwd: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("LOADED "))
    return json.loads(line.removeprefix("LOADED "))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store holding a queued job and a job with a frozen spec, a plan and an attempt log, as a running
    job leaves them (written with the library's own functions)."""
    from entrypoint.job.attempts import claim_attempt
    from entrypoint.job.state import dumps, freeze_spec, job_store
    from entrypoint.store import FileStore
    from jobspec import load_spec

    root_dir = tmp_path_factory.mktemp("light") / "store"
    root = FileStore(root_dir)
    loaded = load_spec(ROOT / "jobspec/examples/quickstart.yaml")
    job = job_store(root, loaded.spec.job.id)
    freeze_spec(job, loaded)
    attempt = claim_attempt(job)
    job.put_bytes(f"attempts/{attempt}/log.txt", b"data: starting\n")
    job.put_bytes("phases/data/result.json", dumps({"seconds": 1.5, "counts": {"train": {"a": 300}}}))
    return root_dir


@pytest.mark.parametrize(
    "command",
    [
        ["validate", QUICKSTART],
        ["plan", QUICKSTART],
        ["schema"],
        ["status", "quickstart-tickets", "--store", "file://{store}"],
        ["logs", "quickstart-tickets", "--store", "file://{store}"],
        ["submit", QUICKSTART, "--store", "file://{store}/other"],
    ],
    ids=lambda c: c[0],
)
def test_light_commands_load_no_torch_or_transformers(command, store, tmp_path):
    args = [part.format(store=store) for part in command]
    loaded = _modules_loaded(*args, cwd=ROOT)  # the quickstart names its data relative to the repo
    assert loaded["code"] in (0, None), loaded
    assert loaded["heavy"] == [], f"rentune {command[0]} imported {loaded['heavy']}"


def test_validate_refuses_a_missing_data_file_without_loading_torch(tmp_path):
    spec = (ROOT / "jobspec/examples/quickstart.yaml").read_text()
    spec = spec.replace("source: examples/data/support-tickets.jsonl", f"source: {tmp_path / 'missing.jsonl'}")
    assert str(tmp_path) in spec
    (tmp_path / "spec.yaml").write_text(spec)
    loaded = _modules_loaded("validate", str(tmp_path / "spec.yaml"), cwd=ROOT)
    assert loaded == {"heavy": [], "code": 2}


def test_the_probe_sees_heavy_imports(store, tmp_path):
    """The check itself can fail: `env` reports torch's version, so it must load torch."""
    assert "torch" in _modules_loaded("env", cwd=tmp_path)["heavy"]


def test_status_shows_each_verdict_with_its_interval_and_an_undecidable_metric(tmp_path):
    from entrypoint.job.state import dumps, freeze_spec, job_store
    from entrypoint.job.status import render_status
    from entrypoint.store import FileStore
    from jobspec import load_spec

    root = FileStore(tmp_path / "store")
    loaded = load_spec(ROOT / "jobspec/examples/quickstart.yaml")
    job = job_store(root, loaded.spec.job.id)
    freeze_spec(job, loaded)
    metric = {"eval": {"examples": 120, "detectable": 0.2}, "test": {"examples": 120, "detectable": 0.2}}
    power = {"metrics": [{"metric": "f1/billing", "role": "guardrail", "asked": 0.15, "decidable": False, **metric}]}
    job.put_bytes("phases/baseline/result.json", dumps({"seconds": 1.0, "power": power}))
    hypothesis = {"metric": "macro_f1", "gain": 0.309, "interval": [0.275, 0.345], "result": "holds"}
    judged = {"hypothesis": hypothesis, "guardrails_result": "pass"}
    job.put_bytes("phases/evaluate/result.json", dumps({"seconds": 1.0, "trials": {"main": judged}}))
    tested = {"selected": "main", "hypothesis": {**hypothesis, "gain": -0.05, "interval": [-0.1, 0.0]}}
    tested["hypothesis"]["result"] = "does not hold"
    job.put_bytes("phases/test/result.json", dumps({"seconds": 1.0, **tested, "guardrails_result": "inconclusive"}))
    text = render_status(root, loaded.spec.job.id)
    assert "eval: macro_f1 +0.309 [+0.275, +0.345]: hypothesis holds; guardrails pass" in text
    assert (
        "sealed test, main: macro_f1 -0.050 [-0.100, +0.000]: hypothesis does not hold; guardrails inconclusive" in text
    )
    assert "power: f1/billing (guardrail) can show changes of 0.200 on eval and 0.200 on test, not the 0.150" in text
