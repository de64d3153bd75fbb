"""One evaluation procedure for the baseline, every trial, the end of training and the sealed test: the same
inputs, the same decoding, the same metrics. `eval_config` describes the procedure; the report checks that
every trial's stored config is equal, so no trial is measured differently from another.

    outputs = predict(model, ...)        labels (classification) or generated text (format, extraction)
    report  = score(spec, rows, outputs) {"metrics": {name: value, ...}, per category/field details, ...}
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from entrypoint.classify import predict_image_labels, predict_labels
from entrypoint.formats import FORMATS_VERSION, extraction_report, format_report
from entrypoint.generate import decoding, generate_responses
from entrypoint.metrics import METRICS_VERSION, classification_report
from entrypoint.preprocess import PREPROCESS_VERSION, is_causal, is_image
from jobspec.schema import JobSpec

__all__ = ["EVAL_VERSION", "eval_config", "predict", "score"]

EVAL_VERSION = "eval-1"


def predict(model, tokenizer, rows: Sequence[dict], spec: JobSpec, labels: Sequence[str], device) -> list[str]:
    """The model's output for every row: a label, or the generated response."""
    if is_image(spec):
        paths = [r["path"] for r in rows]
        modes = spec.data.image_modes
        return predict_image_labels(model, tokenizer, paths, labels, modes, spec.training.eval_batch, device)
    if is_causal(spec):
        return generate_responses(
            model,
            tokenizer,
            [r["prompt"] for r in rows],
            spec.data.template,
            spec.model.max_length,
            spec.model.max_new_tokens,
            spec.training.eval_batch,
            device,
        )
    return predict_labels(
        model,
        tokenizer,
        [r["text"] for r in rows],
        labels,
        spec.model.max_length,
        spec.training.eval_batch,
        device,
    )


def score(spec: JobSpec, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> dict:
    """The task's metrics. Every report has a flat `metrics` dict (name -> value) that guardrails read."""
    task = spec.hypothesis.task
    if task == "classification":
        return classification_report([r["label"] for r in rows], outputs, labels)
    groups = [r["label"] for r in rows] if len(set(labels)) > 1 else None
    if task == "format":
        rule = spec.hypothesis.format
        return format_report(
            outputs, json_schema=rule.json_schema, regex=rule.regex, expect_json=rule.expect_json, groups=groups
        )
    return extraction_report(
        outputs,
        [json.loads(r["response"]) for r in rows],
        required_fields=spec.hypothesis.required_fields,
        fields=spec.hypothesis.fields,
        groups=groups,
    )


def eval_config(spec: JobSpec, split: str, data_version: str, base_sha256: str) -> dict:
    """Everything that decides a measurement, for one split. Equal configs = comparable numbers."""
    causal = is_causal(spec)
    return {
        "eval_version": EVAL_VERSION,
        "task": spec.hypothesis.task,
        "split": split,
        "data_version": data_version,
        "base_model_sha256": base_sha256,
        "preprocess_version": PREPROCESS_VERSION,
        "metrics_version": FORMATS_VERSION if causal else METRICS_VERSION,
        "max_length": spec.model.max_length,
        "eval_batch": spec.training.eval_batch,
        "seed": spec.training.seed,
        "decoding": decoding(spec.model.max_new_tokens) if causal else {"method": "argmax of the classifier logits"},
        **({"modality": "image", "image_modes": spec.data.image_modes} if is_image(spec) else {}),
        **({"template": spec.data.template} if causal else {}),
        **({"format": spec.hypothesis.format.model_dump()} if spec.hypothesis.format else {}),
        **(
            {"required_fields": spec.hypothesis.required_fields, "fields": spec.hypothesis.fields}
            if spec.hypothesis.task == "extraction"
            else {}
        ),
    }
