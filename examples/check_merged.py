"""Serve a merged export with plain transformers, as a user would, and compare with the adapter's answers.

    python examples/check_merged.py JOB [--min-equal 0.99]

JOB is a job's folder in a file:// store (e.g. runs/jobs/extract-chat) or its prefix in a bucket
(s3://my-bucket/rentune/jobs/extract-chat: export/ and the eval split are downloaded with boto3, the
endpoint and credentials from the usual AWS_* variables, the addressing style from
RENTUNE_S3_ADDRESSING_STYLE). This script imports no rentune module: it loads export/merged/ with
AutoModelForCausalLM (or AutoModelForSequenceClassification) and AutoTokenizer, renders each eval
conversation with the exported chat template (and its chat_template_kwargs.json), generates greedily until
the exported generation_config.json's eos, and counts the answers equal to the adapter's on the same
examples (export/parity.json, written by rentune's parity check). Exit 0 when at least --min-equal of them
are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
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


def _download(job: str, folder: Path) -> Path:
    """The files this check reads of an s3:// job prefix (export/ but the adapter, the eval split), under
    `folder` as they lie in the bucket."""
    import boto3
    from botocore.config import Config

    bucket, _, prefix = job.removeprefix("s3://").rstrip("/").partition("/")
    style = os.environ.get("RENTUNE_S3_ADDRESSING_STYLE", "auto")
    s3 = boto3.client("s3", config=Config(s3={"addressing_style": style}))
    keys = [f"{prefix}/phases/data/eval.jsonl"]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/export/"):
        keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].startswith(f"{prefix}/export/adapter/")]
    for key in keys:
        target = folder / key[len(prefix) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", help="the job's folder in a file:// store, or its s3://bucket/prefix/jobs/JOB_ID")
    parser.add_argument("--min-equal", type=float, default=0.99)
    args = parser.parse_args(argv)
    if args.job.startswith("s3://"):
        with tempfile.TemporaryDirectory(prefix="check-merged-") as folder:
            return _check(_download(args.job, Path(folder)), args.min_equal, shown=args.job)
    return _check(Path(args.job), args.min_equal, shown=args.job)


def _check(job: Path, min_equal: float, shown: str) -> int:
    export = job / "export"
    parity = json.loads((export / "parity.json").read_text())
    spec = yaml.safe_load((export / "spec.yaml").read_text())
    rows = _rows(job / "phases/data/eval.jsonl")
    answers = _answers(export / "merged", rows, spec)
    expected = parity["outputs"]["adapter"]
    equal = sum(a == b for a, b in zip(answers, expected, strict=True))
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("entrypoint", "jobspec"))
    assert not loaded, f"this check must not import rentune, yet {loaded} were imported"
    print(
        f"plain transformers on {shown}/export/merged: {equal}/{len(rows)} eval answers equal to the adapter's "
        f"(rentune's parity check: {parity['equal']}/{parity['examples']}, {parity['parity']})"
    )
    return 0 if equal >= min_equal * len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
