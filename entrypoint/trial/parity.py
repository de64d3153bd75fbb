"""The merged model's parity check, run in a fresh process (processes/parity.py) on the export as stored:
the adapter on its base (as evaluated) and the merged folder (as written: in its dtype, loaded as a plain
model, with its own tokenizer and chat template) answer the eval split with the eval's decoding.
Recorded: per example whether the answers are equal, the primary metric of both, and the largest
difference of the logits each answer is read from (a classifier's, or a generated answer's first token's).

    parity ok    the merged model's primary metric is within export.parity_tolerance of the adapter's,
                 and for classifiers the predictions are equal on at least Kind.serving.agreement of eval
    failed       otherwise: the merged folder stays, BINDING.json and the report say so with the figures
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

from entrypoint.context import PhaseContext
from entrypoint.job import layout
from entrypoint.trial.evaluate import trial_adaptation
from jobspec.schema import Adaptation

__all__ = ["LOGIT_EXAMPLES", "parity"]

LOGIT_EXAMPLES = 256  # the logits compared are those of the first eval examples: memory n x vocab x 4 bytes


def parity(ctx: PhaseContext, trial_id: str, adapter: Path, merged: Path, log) -> dict:
    """The parity record of `merged` against `adapter` (both local copies of the export; see the module
    docstring)."""
    side, labels, spec = ctx.kind.model, ctx.labels, ctx.spec
    rows = ctx.read_split("eval")
    answers, logits, dtypes = {}, {}, {}
    record = ctx.read_json(layout.trial_result(trial_id))
    loads = {
        "adapter": lambda: side.load(ctx.model_dir, labels, trial_adaptation(record), trained=adapter),
        "merged": lambda: side.load(merged, labels, Adaptation(method="full"), trained=merged),
    }
    for name, load in loads.items():
        model, processor = load(), side.processor(adapter if name == "adapter" else merged)
        answers[name] = side.predict(model, processor, rows, labels, ctx.device)
        logits[name] = ctx.kind.serving.scores(model, processor, rows[:LOGIT_EXAMPLES], labels, ctx.device)
        dtypes[name] = str(next(model.parameters()).dtype).removeprefix("torch.")
        log(f"{name}: {len(rows)} eval answers ({dtypes[name]})")
        del model
        gc.collect()
    metric = spec.hypothesis.metric
    scores = {name: ctx.kind.task.score(rows, outputs, labels)["metrics"][metric] for name, outputs in answers.items()}
    equal = [a == m for a, m in zip(answers["adapter"], answers["merged"], strict=True)]
    agreement = sum(equal) / len(equal) if equal else 1.0
    difference = abs(scores["merged"] - scores["adapter"])
    tolerance = spec.export.parity_tolerance
    reasons = []
    if difference > tolerance:
        reasons.append(
            f"{metric} {scores['merged']:.4f} merged vs {scores['adapter']:.4f} adapter: off by more than {tolerance}"
        )
    needed = ctx.kind.serving.agreement
    if needed is not None and agreement < needed:
        reasons.append(f"predictions equal on {agreement:.1%} of eval, below {needed:.0%}")
    largest = (logits["merged"] - logits["adapter"]).abs().max().item() if len(logits["adapter"]) else 0.0
    return {
        "parity": "failed" if reasons else "ok",
        "reasons": reasons,
        "metric": metric,
        "adapter": scores["adapter"],
        "merged": scores["merged"],
        "difference": difference,
        "tolerance": tolerance,
        "equal": sum(equal),
        "examples": len(equal),
        "equal_per_example": equal,
        "largest_logit_difference": largest,
        "logits_compared": min(len(rows), LOGIT_EXAMPLES),
        "outputs": {"adapter": answers["adapter"], "merged": answers["merged"]},
        "dtypes": dtypes,  # as each model ran
        "pid": os.getpid(),
    }
