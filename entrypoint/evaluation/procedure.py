"""One evaluation procedure for the baseline, every trial, the end of training and the sealed test: the same
inputs, the same decoding, the same metrics. `eval_config` describes the procedure; the report checks that
every trial's stored config is equal, so no trial is measured differently from another.

    outputs = kind.predict(model, ...)   labels (classification) or generated text (format, extraction)
    report  = score(spec, rows, outputs) {"metrics": {name: value, ...}, per category/field details, ...}
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence

from entrypoint.data.encoding import PREPROCESS_VERSION
from entrypoint.evaluation.bootstrap import Bootstrap
from entrypoint.evaluation.formats import FORMATS_VERSION, extraction_report, format_report
from entrypoint.evaluation.metrics import METRICS_VERSION, classification_report
from entrypoint.job.state import trial_result_key
from entrypoint.kinds import Baseline, JobKind
from entrypoint.store import get_tree
from jobspec.schema import JobSpec

__all__ = ["EVAL_VERSION", "baseline_outputs", "eval_config", "evaluate_trial", "score"]

EVAL_VERSION = "eval-1"


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


def eval_config(spec: JobSpec, kind: JobKind, split: str, data_version: str, base_sha256: str) -> dict:
    """Everything that decides a measurement, for one split. Equal configs = comparable numbers."""
    task, e = spec.hypothesis.task, spec.evaluation
    return {
        "eval_version": EVAL_VERSION,
        "task": task,
        "split": split,
        "data_version": data_version,
        "base_model_sha256": base_sha256,
        "preprocess_version": PREPROCESS_VERSION,
        "metrics_version": METRICS_VERSION if task == "classification" else FORMATS_VERSION,
        "max_length": spec.model.max_length,
        "eval_batch": spec.training.eval_batch,
        "seed": spec.training.seed,
        "intervals": Bootstrap(e.resamples, e.confidence, e.seed).describe(spec.data.cluster_field),
        **kind.eval_settings(),
        **({"format": spec.hypothesis.format.model_dump()} if spec.hypothesis.format else {}),
        **(
            {"required_fields": spec.hypothesis.required_fields, "fields": spec.hypothesis.fields}
            if task == "extraction"
            else {}
        ),
    }


def baseline_outputs(ctx, rows: Sequence[dict]) -> Baseline:
    """The untouched model's outputs on `rows` (a PhaseContext's job), and how they were obtained."""
    kind = ctx.kind
    processor = kind.processor(ctx.model_dir)
    return kind.baseline(ctx.model_dir, processor, rows, ctx.labels, ctx.device, lambda: ctx.read_split("train"))


def evaluate_trial(ctx, trial_id: str, split: str) -> tuple[list[dict], list[str], dict]:
    """Reload a trial's committed weights from the store as a fresh consumer would and predict `split`.
    Returns rows, outputs, report; the report's `observed` says what the evaluation really used (device,
    weights dtype, split bytes)."""
    kind = ctx.kind
    record = ctx.read_json(trial_result_key(trial_id))
    weights = ctx.workdir / "evaluate" / trial_id
    shutil.rmtree(weights, ignore_errors=True)
    get_tree(ctx.store, f"trials/{trial_id}/final", weights)
    model = kind.reload(ctx.model_dir, weights, ctx.labels, record["settings"]["adaptation"]["method"])
    processor = kind.processor(weights)
    rows = ctx.read_split(split)
    outputs = kind.predict(model, processor, rows, ctx.labels, ctx.device)
    observed = {
        "device": ctx.device.type,
        "weights_dtype": str(next(model.parameters()).dtype),
        "examples": len(rows),
        "split_sha256": hashlib.sha256(ctx.store.get_bytes(f"phases/data/{split}.jsonl")).hexdigest(),
        "processor": type(processor).__name__,
    }
    return rows, outputs, {**score(ctx.spec, rows, outputs, ctx.labels), "observed": observed}
