"""Baseline phase: the untouched base model on the eval split, before any training (never the test split,
which stays sealed until one trial is chosen).

For an image model, the baseline is the untouched backbone's embeddings with the nearest category mean
of the train split. For a text encoder, a fresh classification head would only measure its random
initialisation, so the baseline is zero-shot: each text gets the category whose description embeds
closest to it. For a causal LM, the untouched model generates a response to each prompt with the same
decoding every trial uses. Per-example outputs, metrics and the full eval config are stored, so later
comparisons can be audited.

Then the power check, before any GPU hour is spent: for each metric the verdict uses, the smallest change
the eval and test splits can show (evaluation/judge.py: power), against min_gain and each tolerance. The
runner stops the job here when `evaluation.underpowered: fail` and the hypothesis cannot be decided.
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.evaluation.judge import power, power_lines
from entrypoint.evaluation.verdict import guardrail_names
from entrypoint.job import layout
from entrypoint.job.state import to_jsonl
from entrypoint.trial.evaluate import baseline_outputs, split_config

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    rows = ctx.read_split("eval")
    baseline = baseline_outputs(ctx, rows)
    task = ctx.kind.task
    report = task.score(rows, baseline.outputs, ctx.labels)
    # Every guardrail must name a metric this job computes: checked now, not after days of training.
    guardrail_names(ctx.spec.guardrails, report["metrics"])
    config = {**split_config(ctx, "eval"), "baseline": baseline.method}
    ctx.store.put_bytes(
        layout.BASELINE_PREDICTIONS,
        to_jsonl({**row, "output": o} for row, o in zip(rows, baseline.outputs, strict=True)),
    )
    ctx.write_json(layout.BASELINE_EVAL_CONFIG, config)
    ctx.write_json(layout.BASELINE_METRICS, report)
    metric = ctx.spec.hypothesis.metric
    ctx.log(
        f"baseline: {baseline.method['method']} {metric} {report['metrics'][metric]:.3f} on {report['n']} eval examples"
    )
    n_test = sum(ctx.data_result["counts"]["test"].values())
    table = power(ctx.spec, task.tally(rows, baseline.outputs, ctx.labels), rows, n_test)
    for line in power_lines(table):
        ctx.log(f"power: {line}")
    return {"metrics": report["metrics"], "eval_config": config, "power": table}
