"""Baseline phase: the untouched base model on the eval split, before any training (never the test split,
which stays sealed until one trial is chosen).

For an image model, the baseline is the untouched backbone's embeddings with the nearest category mean
of the train split. For a text encoder, a fresh classification head would only measure its random
initialisation, so the baseline is zero-shot: each text gets the category whose description embeds
closest to it. For a causal LM, the untouched model generates a response to each prompt with the same
decoding every trial uses. Per-example outputs, metrics and the full eval config are stored, so later
comparisons can be audited.
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.evaluation.procedure import baseline_outputs, eval_config, score
from entrypoint.evaluation.verdict import check_guardrails
from entrypoint.job.state import to_jsonl
from entrypoint.training.model import hash_base_model

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    rows = ctx.read_split("eval")
    baseline = baseline_outputs(ctx, rows)
    report = score(ctx.spec, rows, baseline.outputs, ctx.labels)
    # Every guardrail must name a metric this job computes: checked now, not after days of training.
    check_guardrails(ctx.spec.guardrails, report["metrics"], report["metrics"])
    base_sha = hash_base_model(ctx.model_dir).sha256
    config = {**eval_config(ctx.spec, ctx.kind, "eval", ctx.data_version, base_sha), "baseline": baseline.method}
    ctx.store.put_bytes(
        "phases/baseline/predictions.jsonl",
        to_jsonl({**row, "output": o} for row, o in zip(rows, baseline.outputs, strict=True)),
    )
    ctx.write_json("phases/baseline/eval_config.json", config)
    ctx.write_json("phases/baseline/metrics.json", report)
    metric = ctx.spec.hypothesis.metric
    ctx.log(
        f"baseline: {baseline.method['method']} {metric} {report['metrics'][metric]:.3f} on {report['n']} eval examples"
    )
    return {"metrics": report["metrics"], "eval_config": config}
