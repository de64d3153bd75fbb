"""Evaluate phase: every completed trial, reloaded from the store as a fresh consumer would, measured on the
eval split with one procedure (entrypoint/evaluation/procedure.py); then the guardrails and the selection.

    for each completed trial:
        download trials/<id>/final, reload (base + adapter), predict the eval split
        the outputs must agree with those recorded at the end of training (else the weights are not what
        was trained); store outputs, metrics and the eval config under trials/<id>/eval/
    guardrails of each trial against the baseline; the primary metric's gain
    select: the best primary metric among trials that pass every guardrail (eval split only)

The sealed test split is not touched here: the test phase opens it once, for the selected trial.
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.evaluation.procedure import eval_config, evaluate_trial
from entrypoint.evaluation.verdict import check_guardrails, hypothesis_verdict
from entrypoint.job.state import read_jsonl, to_jsonl
from entrypoint.training.model import hash_base_model

__all__ = ["MAX_DISAGREEMENT", "EvaluationMismatch", "NoValidTrial", "run"]

# Share of eval examples whose output may differ between the trainer's in-memory model and the reloaded
# one. Non-zero only because GPU kernels are not bit-reproducible; on CPU the observed share is 0.
MAX_DISAGREEMENT = 0.01


class EvaluationMismatch(RuntimeError):
    """The reloaded weights predict differently from the model at the end of training."""


class NoValidTrial(RuntimeError):
    """Every trial was invalid: there is nothing to select, test or export."""


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    trials = ctx.read_json("phases/train/result.json")["trials"]
    config = eval_config(spec, ctx.kind, "eval", ctx.data_version, hash_base_model(ctx.model_dir).sha256)
    baseline = ctx.read_json("phases/baseline/metrics.json")["metrics"]
    results = {}
    for trial_id, summary in trials.items():
        if not summary.get("evaluable"):
            results[trial_id] = {"status": summary["status"], "reason": summary["reason"]}
            continue
        rows, outputs, report = evaluate_trial(ctx, trial_id, "eval")
        at_end = [r["output"] for r in read_jsonl(ctx.store.get_bytes(f"trials/{trial_id}/eval_outputs_at_end.jsonl"))]
        disagree = sum(a != b for a, b in zip(outputs, at_end, strict=True))
        if disagree > MAX_DISAGREEMENT * len(rows):
            raise EvaluationMismatch(
                f"evaluate: trial {trial_id}: the weights reloaded from the store disagree with the trained model "
                f"on {disagree} of {len(rows)} eval examples (allowed: {MAX_DISAGREEMENT:.0%}); the checkpoint is "
                "not trustworthy"
            )
        prefix = f"trials/{trial_id}/eval"
        ctx.store.put_bytes(
            f"{prefix}/predictions.jsonl", to_jsonl({**row, "output": o} for row, o in zip(rows, outputs, strict=True))
        )
        ctx.write_json(f"{prefix}/metrics.json", report)
        ctx.write_json(f"{prefix}/eval_config.json", {**config, "observed": report["observed"]})
        guardrails = check_guardrails(spec.guardrails, baseline, report["metrics"])
        verdict = hypothesis_verdict(spec.hypothesis, baseline, report["metrics"])
        results[trial_id] = {
            "status": summary["status"],
            "reason": summary["reason"],
            "metrics": report["metrics"],
            "hypothesis": verdict,
            "guardrails": guardrails,
            "guardrails_passed": all(g["passed"] for g in guardrails),
            "disagreements_with_training_end": disagree,
        }
        failed = [g["metric"] for g in guardrails if not g["passed"]]
        ctx.log(
            f"evaluate: {trial_id}: {verdict['metric']} {verdict['trial']:.3f} (baseline {verdict['baseline']:.3f}, "
            f"{verdict['gain']:+.3f}); guardrails {'pass' if not failed else 'FAIL: ' + ', '.join(failed)}"
        )
    completed = [t for t, r in results.items() if "metrics" in r]
    if not completed:
        reasons = "; ".join(f"{t}: {r['status']} ({r['reason']})" for t, r in results.items())
        raise NoValidTrial(f"evaluate: no trial completed, nothing to select: {reasons}")
    safe = [t for t in completed if results[t]["guardrails_passed"]]
    pool = safe or completed
    metric = spec.hypothesis.metric
    selected = max(pool, key=lambda t: (results[t]["metrics"][metric], -completed.index(t)))
    why = (
        f"highest {metric} on eval among trials passing every guardrail"
        if safe
        else f"no trial passes every guardrail; highest {metric} on eval"
    )
    ctx.log(f"evaluate: selected trial {selected} ({why})")
    return {"trials": results, "selected": selected, "selection": why, "eval_config": config}
