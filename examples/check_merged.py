"""Serve a merged export with plain transformers, as a user would, and compare with the adapter's answers.

    python examples/check_merged.py JOB_FOLDER [--min-equal 0.99]

JOB_FOLDER is a job's folder in a file:// store (e.g. runs/jobs/extract-chat). This script imports no
rentune module: it loads export/merged/ with AutoModelForCausalLM (or AutoModelForSequenceClassification)
and AutoTokenizer, renders each eval conversation with the exported chat template (and its
chat_template_kwargs.json), generates greedily until the exported generation_config.json's eos, and
counts the answers equal to the adapter's on the same examples (export/parity.json, written by rentune's
parity check). Exit 0 when at least --min-equal of them are equal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

TEMPLATE = "{prompt}\n"  # data.template's default


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@torch.no_grad()
def _answers(merged: Path, rows: list[dict], spec: dict) -> list[str]:
    tokenizer = AutoTokenizer.from_pretrained(merged)
    config = AutoConfig.from_pretrained(merged)
    if any(name.endswith("ForSequenceClassification") for name in config.architectures or []):
        model = AutoModelForSequenceClassification.from_pretrained(merged).eval()
        max_length = spec.get("model", {}).get("max_length", 128)
        out = []
        for row in rows:
            inputs = tokenizer(row["text"], truncation=True, max_length=max_length, return_tensors="pt")
            out.append(model.config.id2label[int(model(**inputs).logits.argmax(-1))])
        return out
    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    kwargs_file = merged / "chat_template_kwargs.json"
    kwargs = json.loads(kwargs_file.read_text()) if kwargs_file.is_file() else {}
    max_new_tokens = spec.get("model", {}).get("max_new_tokens", 128)
    out = []
    for row in rows:
        if "messages" in row:  # the turns before the last assistant turn, with the generation prompt
            text = tokenizer.apply_chat_template(
                row["messages"][:-1], tokenize=False, add_generation_prompt=True, **kwargs
            )
            prefix = []
        else:  # prompt_response: bos + the spec's template
            text = spec.get("data", {}).get("template", TEMPLATE).format(prompt=row["prompt"])
            prefix = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        input_ids = torch.tensor([prefix + tokenizer(text, add_special_tokens=False)["input_ids"]])
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
        )
        answer = tokenizer.decode(generated[0, input_ids.shape[1] :], skip_special_tokens=True).strip()
        _, closed, after = answer.partition("</think>")  # what is scored comes after any reasoning
        out.append(after.strip() if closed else answer)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path, help="the job's folder in a file:// store")
    parser.add_argument("--min-equal", type=float, default=0.99)
    args = parser.parse_args(argv)
    export = args.job / "export"
    parity = json.loads((export / "parity.json").read_text())
    spec = yaml.safe_load((export / "spec.yaml").read_text())
    rows = _rows(args.job / "phases/data/eval.jsonl")
    answers = _answers(export / "merged", rows, spec)
    expected = parity["outputs"]["adapter"]
    equal = sum(a == b for a, b in zip(answers, expected, strict=True))
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("entrypoint", "jobspec"))
    assert not loaded, f"this check must not import rentune, yet {loaded} were imported"
    print(
        f"plain transformers on {export / 'merged'}: {equal}/{len(rows)} eval answers equal to the adapter's "
        f"(rentune's parity check: {parity['equal']}/{parity['examples']}, {parity['parity']})"
    )
    return 0 if equal >= args.min_equal * len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
