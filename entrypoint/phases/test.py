"""Test phase: open the sealed test split once, for the selected trial and the baseline (the seal itself:
entrypoint/evaluation/seal.py). Nothing here selects or tunes: the evaluate phase already chose on eval.
"""

from __future__ import annotations

import hashlib

from entrypoint.context import PhaseContext
from entrypoint.evaluation.judge import judge
from entrypoint.evaluation.seal import open_seal
from entrypoint.job import layout
from entrypoint.job.state import to_jsonl
from entrypoint.trial.evaluate import baseline_outputs, evaluate_trial, split_config

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec, task = ctx.spec, ctx.kind.task
    selected = ctx.result("evaluate")["selected"]
    test_sha256 = hashlib.sha256(ctx.store.get_bytes(layout.TEST_SPLIT)).hexdigest()
    override = open_seal(ctx, test_sha256, selected)

    rows = ctx.read_split("test")
    untouched = baseline_outputs(ctx, rows)
    baseline = task.score(rows, untouched.outputs, ctx.labels)
    _, outputs, report = evaluate_trial(ctx, selected, "test")
    config = split_config(ctx, "test")
    ctx.store.put_bytes(
        layout.TEST_PREDICTIONS,
        to_jsonl(
            {**row, "baseline_output": b, "output": o}
            for row, b, o in zip(rows, untouched.outputs, outputs, strict=True)
        ),
    )
    ctx.write_json(layout.TEST_EVAL_CONFIG, {**config, "baseline": untouched.method})
    ctx.write_json(layout.TEST_METRICS, {"baseline": baseline, selected: report})
    base, trial = task.tally(rows, untouched.outputs, ctx.labels), task.tally(rows, outputs, ctx.labels)
    with ctx.timed("judge"):
        judged = judge(spec, rows, base, trial)
    ctx.count("judged")
    v = judged["hypothesis"]
    ctx.log(
        f"test: {selected}: {v['metric']} {v['trial']:.3f} vs baseline {v['baseline']:.3f} on {len(rows)} sealed test "
        f"examples, {v['gain']:+.3f} [{v['interval'][0]:+.3f}, {v['interval'][1]:+.3f}]: hypothesis {v['result']}; "
        f"guardrails {judged['guardrails_result']}"
    )
    return {
        "selected": selected,
        "test_sha256": test_sha256,
        "override": override,
        "baseline": baseline["metrics"],
        "trial": report["metrics"],
        "hypothesis": v,
        "guardrails": judged["guardrails"],
        "guardrails_result": judged["guardrails_result"],
        "comparison": judged["comparison"],
        "changed": judged["changed"],
        "eval_config": config,
    }
