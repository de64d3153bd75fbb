"""Chat fine-tuning on a tiny causal LM with a byte-level BPE tokenizer and a ChatML template, through the
real `rentune` process: messages data (multi-turn included), the loss on assistant turns, generation with
the same template, and an export that plain transformers + peft reload in a fresh process to reproduce
rentune's eval outputs. Malformed rows of each chat format are refused with exit 2 and file:line, and no
data phase output is stored. (The tiny random model learns little; tests/integration/test_smollm2.py runs
the real one.)"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.models import build_tiny_chat_lm

RENTUNE = Path(sys.executable).parent / "rentune"
ROOT = Path(__file__).resolve().parents[2]
NAMES = ["Ada Lovelace", "Bo Chen", "Cy Young", "Di Prima", "Ed Okafor", "Flo Rida", "Gus Grissom", "Ivy Park"]
PRODUCTS = ["desk lamp", "coffee mill", "usb hub", "tea kettle", "phone stand", "wall clock"]
SYSTEM = "Extract the order as JSON with customer, product and quantity."


def _rows(n: int = 60) -> list[dict]:
    rng = random.Random(3)
    rows = []
    for i in range(n):
        name, product, quantity = NAMES[i % len(NAMES)], PRODUCTS[i % len(PRODUCTS)], 1 + (i * 7) % 40
        filler = " ".join(
            rng.choice(["please", "thanks", "soon", "kindly", "asap", "cheers", "hello"]) for _ in range(5)
        )
        answer = json.dumps({"customer": name, "product": product, "quantity": quantity})
        turns = [{"role": "system", "content": SYSTEM}]
        if i % 10 == 0:  # multi-turn: a clarifying question first
            turns += [
                {"role": "user", "content": f"{filler} order {i}: {product} for {name}"},
                {"role": "assistant", "content": "How many would you like?"},
                {"role": "user", "content": f"{quantity} please"},
            ]
        else:
            turns.append({"role": "user", "content": f"{filler} order {i}: {quantity} x {product} for {name}"})
        rows.append(
            {"messages": [*turns, {"role": "assistant", "content": answer}], "channel": "web" if i % 2 else "mail"}
        )
    return rows


def _texts() -> list[str]:
    return [t["content"] for r in _rows() for t in r["messages"]]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return build_tiny_chat_lm(tmp_path_factory.mktemp("chat") / "llama", _texts())


def _spec(model: Path, data: Path, **data_section) -> dict:
    return {
        "job": {"id": "chat"},
        "hypothesis": {
            "task": "extraction",
            "statement": "An adapter makes a tiny LM emit the order fields.",
            "required_fields": ["customer", "quantity"],
        },
        "guardrails": [{"metric": "json_valid_rate", "tolerance": 1.0}],
        "model": {"path": str(model), "max_length": 160, "max_new_tokens": 24},
        "data": {"source": str(data), "format": "messages", "label_field": "channel", **data_section},
        "adaptation": {"method": "lora", "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "training": {"max_steps": 6, "microbatch": 8, "learning_rate": 0.01, "device": "cpu", "eval_batch": 16},
    }


def _rentune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([RENTUNE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_chat_job_trains_on_assistant_turns_and_the_export_reproduces_its_outputs(tmp_path, chat_model):
    data = tmp_path / "orders.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data)))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = tmp_path / "store/jobs/chat"
    recipe = json.loads((job / "phases/data/result.json").read_text())["recipe"]
    assert recipe["format"] == "messages" and recipe["end_of_turn"] == "<|im_end|>"
    inspection = json.loads((job / "phases/data/inspection.json").read_text())
    for record in inspection["examples"]:  # the counted tokens are the assistant turns, nothing else
        counted = "".join(t["piece"] for t in record["tokens"] if t["in_loss"])
        assert counted.endswith("<|im_end|>") and record["row"]["response"] in counted.replace("Ġ", " ")
    eval_config = json.loads((job / "trials/main/eval/eval_config.json").read_text())
    assert eval_config["chat_template_sha256"] == recipe["chat_template_sha256"]
    assert "<|im_end|>" in eval_config["decoding"]["stop"]
    assert "generation:" in done.stdout and "tokens/s" in done.stdout
    binding = json.loads((job / "export/BINDING.json").read_text())
    assert binding["chat_template_sha256"] == recipe["chat_template_sha256"]
    assert "adapter/chat_template.jinja" in binding["files"]

    # A fresh process with plain transformers + peft: the exported tokenizer renders the prompt with the
    # exported template, and greedy generation gives rentune's eval outputs.
    predictions = [json.loads(line) for line in (job / "trials/main/eval/predictions.jsonl").read_text().splitlines()]
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from peft import PeftModel
            from transformers import AutoModelForCausalLM, AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained({str(job / "export/adapter")!r})
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(chat_model)!r}),
                                              {str(job / "export/adapter")!r}).eval()
            stop = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
            for row in json.load(sys.stdin):
                text = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
                ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
                out = model.generate(**ids, do_sample=False, max_new_tokens=24, eos_token_id=stop,
                                     pad_token_id=tokenizer.pad_token_id)
                answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
                print(json.dumps(answer.strip()))
            """
        )
    )
    fresh = subprocess.run(
        [sys.executable, str(probe)], input=json.dumps(predictions[:5]), capture_output=True, text=True, timeout=300
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert [json.loads(line) for line in fresh.stdout.splitlines()] == [p["output"] for p in predictions[:5]]

    # The merged folder (export.merged: the default for causal LMs): bound, checked against the adapter in a
    # fresh process, and served by plain transformers alone (examples/check_merged.py imports no rentune).
    merged = binding["merged"]
    assert merged["parity"] == "ok" and merged["method"] == "streamed" and merged["dtype"] == "float32"
    names = {name for name in binding["files"] if name.startswith("merged/")}
    assert {"merged/model.safetensors", "merged/config.json", "merged/chat_template.jinja"} <= names
    assert {"merged/generation_config.json", "Modelfile", "SERVING.md", "parity.json"} <= {*names, *binding["files"]}
    generation = json.loads((job / "export/merged/generation_config.json").read_text())
    tokenizer_config = json.loads((job / "export/merged/tokenizer_config.json").read_text())
    assert generation["eos_token_id"] in (1, [1])  # <|im_end|>: eos and the end of turn the eval stopped at
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    modelfile = (job / "export/Modelfile").read_text()
    assert "FROM ./merged" in modelfile and "<|im_start|>assistant" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and 'PARAMETER stop "<|im_start|>"' in modelfile
    assert "## Serving" in (job / "export/report.md").read_text()
    served = subprocess.run(
        [sys.executable, str(ROOT / "examples/check_merged.py"), str(job)], capture_output=True, text=True, timeout=300
    )
    assert served.returncode == 0, served.stdout[-2000:] + served.stderr[-3000:]
    n = len(predictions)
    assert f": {n}/{n} eval answers equal to the adapter's" in served.stdout  # >= 99% asked; all of them here

    # A changed byte in the merged weights: check-export names the file.
    copy = tmp_path / "export-copy"
    shutil.copytree(job / "export", copy)
    weights = copy / "merged/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    checked = _rentune("check-export", str(copy), "--base", str(chat_model), cwd=tmp_path)
    assert checked.returncode == 2 and f"{weights}: differs from its sha256" in checked.stderr, checked.stderr


SYSTEM_TURN = {"role": "system", "content": "s"}
BAD_ROWS = {
    "messages": [
        ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[0].role is 'bot'; expected one of system"),
        (
            {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a"}]},
            "turn 0 (user) has empty content",
        ),
        ({"messages": [SYSTEM_TURN, {"role": "user", "content": "q"}]}, "no assistant turn"),
        ({"messages": [{"role": "user", "content": ["q"]}]}, "messages[0].content is a list; expected text"),
        ({"messages": "q"}, "field 'messages' is a str; expected a list of turns"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "an assistant turn comes before any user turn"),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                    {"role": "system", "content": "s"},
                ]
            },
            "turn 2 is a system turn",
        ),
    ],
    "sharegpt": [
        ({"conversations": [{"from": "robot", "value": "hi"}]}, "conversations[0].from is 'robot'"),
        ({"conversations": [{"from": "human", "value": 3}]}, "conversations[0].value is an int; expected text"),
        ({"conversations": [{"from": "human", "value": "q"}]}, "no assistant turn"),
        ({"messages": []}, "field 'conversations' is missing"),
    ],
    "alpaca": [
        ({"instruction": "do", "output": 5}, "field 'output' is an int; expected text"),
        ({"input": "x", "output": "y"}, "field 'instruction' is missing"),
        ({"instruction": "do", "output": "  "}, "turn 1 (assistant) has empty content"),
    ],
}


@pytest.mark.parametrize("fmt", sorted(BAD_ROWS))
def test_malformed_rows_are_refused_with_file_and_line_and_nothing_is_stored(tmp_path, chat_model, fmt):
    good = {
        "messages": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "sharegpt": {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        "alpaca": {"instruction": "do", "input": "", "output": "done"},
    }[fmt]
    lines = [json.dumps(good)] + [json.dumps(row) for row, _ in BAD_ROWS[fmt]]
    if fmt == "alpaca":  # a null input is no input, as an absent one is: this last row is fine
        lines.append(json.dumps({"instruction": "do it", "input": None, "output": "done"}))
    data = tmp_path / f"{fmt}.jsonl"
    data.write_text("\n".join(lines) + "\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data, format=fmt)))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", "--until", "data", cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    for number, (_, message) in enumerate(BAD_ROWS[fmt], start=2):
        assert f"{data}:{number}: {message}" in done.stderr, (number, message, done.stderr)
    assert done.stderr.count(f"{data}:") == len(BAD_ROWS[fmt]), done.stderr  # the good rows are not named
    assert not (tmp_path / "store/jobs/chat/phases").exists()


def test_last_assistant_needs_the_assistant_to_speak_last(tmp_path, chat_model):
    row = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "ok"},
        ]
    }
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row) + "\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data, train_on="last_assistant")))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", "--until", "data", cwd=tmp_path)
    assert done.returncode == 2
    assert (
        f"{data}:1: the last turn is from the user; expected the assistant (data.train_on: last_assistant)"
        in done.stderr
    )


def _long_rows(data: Path) -> tuple[list[int], int]:
    """The job's rows, with every 12th given a system turn that fills max_length (nothing left to train
    on), and one conversation of 3,000 short turns. Returns the untrainable rows' line numbers and the
    long conversation's."""
    rows, untrainable = _rows(), []
    for i, row in enumerate(rows):
        if i % 12 == 5:
            row["messages"][0]["content"] = "please kindly " * 120
            untrainable.append(i + 1)
    turns = [{"role": r, "content": f"{r} turn {k}"} for k in range(1500) for r in ("user", "assistant")]
    rows.append({"messages": [{"role": "system", "content": SYSTEM}, *turns], "channel": "web"})
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return untrainable, len(rows)


def test_rows_with_nothing_to_train_on_are_dropped_named_and_shown_in_the_inspection(tmp_path, chat_model):
    data = tmp_path / "long.jsonl"
    untrainable, long_line = _long_rows(data)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data)))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", "--until", "data", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = (
        f"data: {len(untrainable)} rows dropped: every token that counts in the loss lies past model.max_length "
        f"(the first: {data}:{untrainable[0]}; data.truncation: drop)"
    )
    assert expected in done.stdout
    phase = tmp_path / "store/jobs/chat/phases/data"
    inspection = json.loads((phase / "inspection.json").read_text())
    assert inspection["untrainable"] == {
        "policy": "drop",
        "dropped": len(untrainable),
        "first": f"{data}:{untrainable[0]}",
    }
    assert f"{len(untrainable)} dropped, the first at {data}:{untrainable[0]}" in (phase / "inspection.md").read_text()
    kept = [json.loads(line) for name in ("train", "eval", "test") for line in (phase / f"{name}.jsonl").open()]
    assert len(kept) == 61 - len(untrainable)  # the 3,000-turn conversation is kept: its first answer fits
    assert not any("please kindly please kindly" in row["messages"][0]["content"] for row in kept)
    assert json.loads((phase / "result.json").read_text())["untrainable"]["dropped"] == len(untrainable)
    assert long_line == 61


def test_rows_with_nothing_to_train_on_are_refused_each_named_with_truncation_fail(tmp_path, chat_model):
    data = tmp_path / "long.jsonl"
    untrainable, _ = _long_rows(data)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data, truncation="fail")))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", "--until", "data", cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    for line in untrainable:
        assert (
            f"{data}:{line}: every token that counts in the loss lies past model.max_length (data.truncation: fail)"
            in done.stderr
        )
    assert not (tmp_path / "store/jobs/chat/phases").exists()


def test_a_row_larger_than_max_length_can_use_is_refused_with_file_and_line(tmp_path, chat_model):
    data = tmp_path / "huge.jsonl"
    rows = _rows()
    rows[7]["messages"][1]["content"] = "x" * 2_500_000  # 2.5 MB: the limit is max(1 MB, 64 x 160 bytes)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data)))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", "--until", "data", cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    pattern = rf"{re.escape(str(data))}:8: ([\d,]+) bytes in one row; expected at most ([\d,]+) bytes"
    said = re.search(pattern, done.stderr)
    assert said and int(said[1].replace(",", "")) >= 2_500_000 > int(said[2].replace(",", "")) >= 1_000_000
    assert done.stderr.count(f"{data}:") == 1
    assert not (tmp_path / "store/jobs/chat/phases").exists()


def test_a_chat_job_with_qwen3s_real_template_without_thinking_renders_and_exports_with_its_arguments(
    tmp_path, chat_model
):
    """Qwen3's real template (tests/chat_templates.py) on the tiny model, with enable_thinking: false: the
    empty think block is part of every generation prompt, the trained spans start after it, and the export
    carries the template and its arguments, which check-export verifies."""
    from tests.chat_templates import template_file

    template = tmp_path / "qwen3.jinja"
    template.write_text(template_file("qwen3").read_text())
    data = tmp_path / "orders.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(40)))
    kwargs = {"enable_thinking": False}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(chat_model, data, chat_template=str(template), chat_template_kwargs=kwargs)))
    done = _rentune("run", str(spec), "--store", f"file://{tmp_path / 'store'}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = tmp_path / "store/jobs/chat"
    recipe = json.loads((job / "phases/data/result.json").read_text())["recipe"]
    assert recipe["chat_template_kwargs"] == kwargs and recipe["mask"] == "spans in the rendering"
    assert recipe["generation_prompt"] == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert "reasoning of earlier answers is left out of the rendering" in " ".join(recipe["notes"])
    assert "## Chat template" in (job / "phases/data/inspection.md").read_text()
    inspection = json.loads((job / "phases/data/inspection.json").read_text())
    for record in inspection["examples"]:  # the answer and its end of turn count, the think block does not
        counted = "".join(t["piece"] for t in record["tokens"] if t["in_loss"]).replace("Ġ", " ").replace("Ċ", "\n")
        assert counted.endswith("<|im_end|>") and "think>" not in counted
        assert record["row"]["response"] in counted
    eval_config = json.loads((job / "trials/main/eval/eval_config.json").read_text())
    assert eval_config["chat_template_kwargs"] == kwargs
    binding = json.loads((job / "export/BINDING.json").read_text())
    assert binding["chat_template_kwargs"] == kwargs
    assert json.loads((job / "export/adapter/chat_template_kwargs.json").read_text()) == kwargs
    assert (job / "export/adapter/chat_template.jinja").read_text() == template.read_text()

    checked = _rentune("check-export", str(job / "export"), "--base", str(chat_model), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    export = tmp_path / "export"
    shutil.copytree(job / "export", export)
    (export / "adapter/chat_template_kwargs.json").write_text(json.dumps({"enable_thinking": True}))
    refused = _rentune("check-export", str(export), "--base", str(chat_model), cwd=tmp_path)
    assert refused.returncode != 0
    assert "chat_template_kwargs.json: not the chat template arguments trained with" in refused.stdout + refused.stderr
