"""Evaluate phase: every completed trial, reloaded from the store as a fresh consumer would, measured on the
eval split with one procedure (entrypoint/evaluation/procedure.py); then the guardrails and the selection.

    for each completed trial:
        download trials/<id>/final, reload (base + adapter), predict the eval split
        the outputs must agree with those recorded at the end of training (else the weights are not what
        was trained); store outputs, metrics and the eval config under trials/<id>/eval/
    each trial against the baseline, paired on the same examples (evaluation/judge.py): every metric's
        change with its bootstrap interval, the hypothesis (holds / does not hold / inconclusive), the
        guardrails (pass / fail / inconclusive), the examples fixed and broken
    select (evaluation/selection.py): the highest primary metric among trials with no failed guardrail (eval
        split only), and the paired interval of the selected trial against the runner-up

The sealed test split is not touched here: the test phase opens it once, for the selected trial.
"""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.evaluation.judge import judge, versus
from entrypoint.evaluation.selection import NoValidTrial, select
from entrypoint.job import layout
from entrypoint.job.state import read_jsonl, to_jsonl
from entrypoint.trial.evaluate import evaluate_trial, split_config

__all__ = ["MAX_DISAGREEMENT", "EvaluationMismatch", "NoValidTrial", "run"]

# Share of eval examples whose output may differ between the trainer's in-memory model and the reloaded
# one. Non-zero only because GPU kernels are not bit-reproducible; on CPU the observed share is 0.
MAX_DISAGREEMENT = 0.01


class EvaluationMismatch(RuntimeError):
    """The reloaded weights predict differently from the model at the end of training."""


def run(ctx: PhaseContext) -> dict:
    spec, task = ctx.spec, ctx.kind.task
    trials = ctx.result("train")["trials"]
    config = split_config(ctx, "eval")
    baseline_outputs = [r["output"] for r in read_jsonl(ctx.store.get_bytes(layout.BASELINE_PREDICTIONS))]
    baseline, results, tally_of = None, {}, {}
    for trial_id, summary in trials.items():
        if not summary.get("evaluable"):
            results[trial_id] = {"status": summary["status"], "reason": summary["reason"]}
            continue
        rows, outputs, report = evaluate_trial(ctx, trial_id, "eval")
        at_end = [r["output"] for r in read_jsonl(ctx.store.get_bytes(layout.trial_outputs_at_end(trial_id)))]
        disagree = sum(a != b for a, b in zip(outputs, at_end, strict=True))
        if disagree > MAX_DISAGREEMENT * len(rows):
            raise EvaluationMismatch(
                f"evaluate: trial {trial_id}: the weights reloaded from the store disagree with the trained model "
                f"on {disagree} of {len(rows)} eval examples (allowed: {MAX_DISAGREEMENT:.0%}); the checkpoint is "
                "not trustworthy"
            )
        prefix = layout.trial_eval(trial_id)
        ctx.store.put_bytes(
            f"{prefix}/predictions.jsonl", to_jsonl({**row, "output": o} for row, o in zip(rows, outputs, strict=True))
        )
        ctx.write_json(f"{prefix}/metrics.json", report)
        ctx.write_json(f"{prefix}/eval_config.json", {**config, "observed": report["observed"]})
        if baseline is None:  # the eval rows, the same for every trial
            baseline = task.tally(rows, baseline_outputs, ctx.labels)
        tally_of[trial_id], eval_rows = task.tally(rows, outputs, ctx.labels), rows
        with ctx.timed("judge"):
            judged = judge(spec, rows, baseline, tally_of[trial_id])
        ctx.count("judged")
        results[trial_id] = {
            "status": summary["status"],
            "reason": summary["reason"],
            "metrics": report["metrics"],
            "hypothesis": judged["hypothesis"],
            "guardrails": judged["guardrails"],
            "guardrails_result": judged["guardrails_result"],
            "comparison": judged["comparison"],
            "changed": judged["changed"],
            "disagreements_with_training_end": disagree,
        }
        v = judged["hypothesis"]
        failed = [f"{g['metric']} {g['result']}" for g in judged["guardrails"] if g["result"] != "pass"]
        ctx.log(
            f"evaluate: {trial_id}: {v['metric']} {v['trial']:.3f} (baseline {v['baseline']:.3f}, {v['gain']:+.3f} "
            f"[{v['interval'][0]:+.3f}, {v['interval'][1]:+.3f}]): hypothesis {v['result']}; guardrails "
            f"{judged['guardrails_result']}{': ' + ', '.join(failed) if failed else ''}"
        )
    choice = select(results, spec.hypothesis.metric)
    selected, why = choice.selected, choice.why
    runner_up = None
    if choice.runner_up is not None:
        other = choice.runner_up
        runner_up = {"trial_id": other, **versus(spec, eval_rows, tally_of[other], tally_of[selected])}
        low, high = runner_up["interval"]
        why += f"; against the runner-up {other}: {runner_up['change']:+.3f} [{low:+.3f}, {high:+.3f}], " + (
            "decided" if runner_up["decided"] else "not decided (the interval includes 0)"
        )
    ctx.log(f"evaluate: selected trial {selected} ({why})")
    return {"trials": results, "selected": selected, "selection": why, "runner_up": runner_up, "eval_config": config}
