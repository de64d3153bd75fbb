"""A structured-extraction job on a tiny causal LM, end to end through the real `rentune` process: the
untouched model's generations are the baseline, the trained adapter generates with the same fixed decoding,
and every phase through the report and export completes. (A 32-wide random model learns little; this test
checks the pipeline and what it records, the unit tests check the metric definitions.)"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.models import build_tiny_causal_lm

RENTUNE = Path(sys.executable).parent / "rentune"
NAMES = ["ada", "bo", "cy", "di", "ed", "flo", "gus", "hal", "ivy", "jo", "kai", "lu", "max", "ned", "oz", "pia"]
CITIES = ["paris", "oslo", "rome", "lima", "quito"]


def _rows() -> list[dict]:
    rng = random.Random(5)
    rows = []
    for i in range(60):
        name, city, age = NAMES[i % len(NAMES)], CITIES[i % len(CITIES)], 20 + i
        words = " ".join(rng.choice(["note", "ref", "memo", "entry", "record"]) for _ in range(4))
        rows.append(
            {
                "prompt": f"{words} {i}: {name} aged {age} lives in {city}",
                "response": json.dumps({"name": name, "age": age, "city": city}),
                "kind": "person" if i % 2 else "customer",
            }
        )
    return rows


def test_extraction_job_runs_every_phase_with_fixed_decoding(tmp_path):
    model = build_tiny_causal_lm(tmp_path / "llama")
    data = tmp_path / "people.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    spec = {
        "job": {"id": "extract"},
        "hypothesis": {
            "task": "extraction",
            "statement": "An adapter makes a tiny LM emit the fields.",
            "required_fields": ["name", "age"],
        },
        "guardrails": [{"metric": "json_valid_rate", "tolerance": 1.0}],
        "model": {"path": str(model), "max_length": 64, "max_new_tokens": 12},
        "data": {"source": str(data), "label_field": "kind", "template": "extract: {prompt}\nanswer: "},
        "adaptation": {"method": "lora", "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "training": {"max_steps": 6, "microbatch": 8, "learning_rate": 0.01, "device": "cpu", "eval_batch": 16},
        "experiments": [
            {
                "id": "full",
                "changes": ["adaptation.method"],
                "rationale": "all weights",
                "adaptation": {"method": "full"},
            }
        ],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RENTUNE_HEARTBEAT_SECONDS": "0.05"}  # progress lines, often
    run = subprocess.run(
        [RENTUNE, "run", str(path), "--store", f"file://{tmp_path / 'store'}", "--workdir", str(tmp_path / "w")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    job = tmp_path / "store/jobs/extract"
    # the probe, a phase with no line of its own for minutes on a large model, says how far it is
    beats = re.findall(r"^probe: (\d+)/(\d+) measurements in \d+ s \(.*\)(?:; now: .+)?$", run.stdout, re.M)
    assert beats and all(int(done) <= int(total) for done, total in beats), run.stdout
    # (generation's own lines: tests/unit/test_heartbeat.py; here its 12 answers can take under 0.05 s)

    baseline_config = json.loads((job / "phases/baseline/eval_config.json").read_text())
    assert baseline_config["decoding"] == {
        "strategy": "greedy",
        "do_sample": False,
        "num_beams": 1,
        "max_new_tokens": 12,
        "use_cache": True,
        "stop": ["eos"],
    }
    assert baseline_config["baseline"] == {"method": "untouched_model_generation"}
    for trial in ("main", "full"):
        config = json.loads((job / f"trials/{trial}/eval/eval_config.json").read_text())
        assert {k: v for k, v in baseline_config.items() if k != "baseline"} == {
            k: v for k, v in config.items() if k != "observed"
        }
        assert config["observed"]["examples"] == 12 and config["observed"]["weights_dtype"] == "torch.float32"
        metrics = json.loads((job / f"trials/{trial}/eval/metrics.json").read_text())["metrics"]
        for name in ("json_valid_rate", "required_present_rate", "field_accuracy", "field_accuracy/city"):
            assert 0.0 <= metrics[name] <= 1.0, name
        predictions = [json.loads(line) for line in (job / f"trials/{trial}/eval/predictions.jsonl").open()]
        assert all(isinstance(p["output"], str) for p in predictions) and len(predictions) == 12
    evaluated = json.loads((job / "phases/evaluate/result.json").read_text())
    assert all(t["disagreements_with_training_end"] == 0 for t in evaluated["trials"].values())
    results = json.loads((job / "report/results.json").read_text())
    assert results["hypothesis"]["metric"] == "field_accuracy" and len(results["trials"]) == 2
    assert (job / "report/report.md").read_text().count("| field_accuracy/") >= 3
    binding = json.loads((job / "export/BINDING.json").read_text())
    assert binding["trial_id"] == results["selected"]["trial_id"]
    assert binding["adaptation"] == ("full" if binding["trial_id"] == "full" else "lora")
