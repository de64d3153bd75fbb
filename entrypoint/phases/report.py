"""Report phase: results.json (with its JSON Schema), report.md and the PNG plots, from what the earlier
phases committed. Pure bookkeeping: no model is loaded, so it is cheap to run again."""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.errors import InvalidInput
from entrypoint.evaluation.verdict import RULES
from entrypoint.job.state import dumps, trial_result_key
from entrypoint.report.markdown import render_markdown
from entrypoint.report.plots import category_bars_png, loss_curves_png
from entrypoint.report.results import (
    RESULTS_VERSION,
    Results,
    bar_family,
    checkpoint_summary,
    config_sha256,
    limitations,
    throughput_summary,
)
from entrypoint.tracking import RunRef, open_tracking, stored_ids, tracking_key
from entrypoint.training.environment import environment

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    data = ctx.data_result
    baseline = ctx.read_json("phases/baseline/result.json")
    train = ctx.read_json("phases/train/result.json")
    evaluated = ctx.read_json("phases/evaluate/result.json")
    test = ctx.read_json("phases/test/result.json")
    selected = evaluated["selected"]
    if "runner_up" not in evaluated or "comparison" not in test:
        raise InvalidInput(
            "report: phases/evaluate and phases/test were committed by an earlier rentune that compared point "
            "estimates; their stored predictions remain. Delete phases/evaluate/result.json and "
            "phases/test/result.json (and the test's seal, sealed-tests/..., or pass --reopen-test) to judge them "
            "again with intervals, or run the spec under a new job.id"
        )

    trials, configs = [], []
    records = {}
    for trial_id in train["order"]:
        record = records[trial_id] = ctx.read_json(trial_result_key(trial_id))
        scored = evaluated["trials"][trial_id]
        config_key = f"trials/{trial_id}/eval/eval_config.json"
        config = ctx.read_json(config_key) if "metrics" in scored else None
        if config is not None:
            configs.append(config)
        trials.append(
            {
                "id": trial_id,
                "reference": record["reference"],
                "changes": record["changes"],
                "rationale": record["rationale"],
                "status": record["status"],
                "reason": record["reason"],
                "steps": record.get("steps"),
                "planned_steps": record.get("planned_steps"),
                "budget": record["budget"],
                "metrics": scored.get("metrics"),
                "hypothesis": scored.get("hypothesis"),
                "guardrails": scored.get("guardrails", []),
                "guardrails_result": scored.get("guardrails_result"),
                "comparison": scored.get("comparison"),
                "changed": scored.get("changed"),
                "eval_config_sha256": config_sha256(config) if config else None,
                "losses": record.get("losses", []),
                "eval_losses": record.get("eval_losses", []),
                "checkpoints": checkpoint_summary(record),
                "throughput": throughput_summary(record),
            }
        )
    chosen = evaluated["trials"][selected]
    env = environment()
    results = {
        "results_version": RESULTS_VERSION,
        "job": {"id": spec.job.id, "description": spec.job.description, "spec_sha256": ctx.spec_sha256},
        "hypothesis": {**spec.hypothesis.model_dump(include={"task", "statement", "metric", "min_gain"})},
        "guardrails": [g.model_dump() for g in spec.guardrails],
        "data": {"data_version": data["data_version"], "counts": data["counts"], "leaks": data["leaks"]["counts"]},
        "baseline": {"method": baseline["eval_config"]["baseline"]["method"], "metrics": baseline["metrics"]},
        "trials": trials,
        "eval_configs_identical": len({config_sha256(c) for c in configs}) <= 1,
        "selected": {"trial_id": selected, "why": evaluated["selection"], "runner_up": evaluated["runner_up"]},
        "intervals": evaluated["eval_config"]["intervals"],
        "rules": RULES,
        "power": baseline["power"],
        "verdict": {"eval": _split_verdict(chosen), "test": _split_verdict(test)},
        "test": {
            "test_sha256": test["test_sha256"],
            "examples": sum(data["counts"]["test"].values()),
            "override": test["override"],
            "baseline": test["baseline"],
            "trial": test["trial"],
            "guardrails": test["guardrails"],
            "comparison": test["comparison"],
            "changed": test["changed"],
        },
        "environment": {"backend": env["backend"], "torch": env["torch"], **env["packages"], "rentune": env["rentune"]},
        "limitations": [],
    }
    results["limitations"] = limitations(results, records, results["baseline"]["method"])
    Results.model_validate(results)  # the schema we publish is the one we write

    curves = {
        t["id"]: {
            "train": [(p["step"], p["loss"]) for p in t["losses"]],
            "eval": [(p["step"], p["loss"]) for p in t["eval_losses"]],
        }
        for t in trials
    }
    family, names = bar_family(spec.hypothesis.task, baseline["metrics"])
    series = {"baseline": [baseline["metrics"][n] for n in names]}
    series.update({t["id"]: [t["metrics"][n] for n in names] for t in trials if t["metrics"]})
    files = {
        "loss_curves.png": loss_curves_png(curves),
        "per_category.png": category_bars_png(
            [n.split("/", 1)[-1] for n in names], series, metric=family, title=f"{family} on eval"
        ),
        "results.json": dumps(results),
        "results.schema.json": dumps(Results.model_json_schema()),
        "report.md": render_markdown(results).encode(),
    }
    local = ctx.workdir / "report"
    local.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        ctx.store.put_bytes(f"report/{name}", data)
        (local / name).write_bytes(data)
    ctx.log(f"report: {ctx.store.uri}/report/report.md ({len(results['limitations'])} limitations noted)")
    _track(ctx, results, [local / name for name in files if name != "results.schema.json"])
    return {"selected": selected, "verdict": results["verdict"], "files": sorted(_files(ctx))}


def _split_verdict(scored: dict) -> dict:
    """The verdict on one split: the hypothesis' result, the gain and its interval, the guardrails' result."""
    h = scored["hypothesis"]
    return {
        "hypothesis": h["result"],
        "gain": h["gain"],
        "interval": h["interval"],
        "min_gain": h["min_gain"],
        "guardrails": scored["guardrails_result"],
    }


def _files(ctx: PhaseContext) -> list[str]:
    return [info.key for info in ctx.store.list("report")]


def _track(ctx: PhaseContext, results: dict, files: list) -> None:
    """Each trial's tracker runs get the results, once: the baseline's and the trial's eval metrics (at the
    trial's last step), the selected trial's test metrics, the verdict and status as run-level values, and
    the report's files. Only the runs training opened (a trial that never started has none), and each once:
    `reported` in the trial's tracking.json lists the trackers done, so a rerun retries only the others."""
    if not ctx.spec.tracking.enabled:
        return
    selected, verdict = results["selected"]["trial_id"], results["verdict"]
    for trial in results["trials"]:
        stored = stored_ids(ctx.store, trial["id"], ctx.log) or {}
        reported = set(stored.get("reported") or [])
        pending = {name for name in ctx.spec.tracking.enabled if name in stored} - reported
        if not pending:
            continue
        run = RunRef(ctx.spec.job.id, trial["id"], ctx.store, ctx.workdir / "tracking", "report")
        tracking = open_tracking(ctx.spec.tracking, run, ctx.log, only=pending)
        metrics = {f"baseline/{k}": v for k, v in results["baseline"]["metrics"].items()}
        metrics.update({f"eval/{k}": v for k, v in (trial["metrics"] or {}).items()})
        summary = {"status": trial["status"], "reason": trial["reason"] or "", "selected": str(trial["id"] == selected)}
        if trial["hypothesis"]:  # this trial's own verdict on eval, with the gain's interval
            h = trial["hypothesis"]
            metrics.update(
                {"eval/gain": h["gain"], "eval/gain_low": h["interval"][0], "eval/gain_high": h["interval"][1]}
            )
            summary.update({"eval.hypothesis": h["result"], "eval.guardrails": str(trial["guardrails_result"])})
        if trial["id"] == selected:
            metrics.update({f"test/{k}": v for k, v in results["test"]["trial"].items()})
            metrics.update({f"test/baseline/{k}": v for k, v in results["test"]["baseline"].items()})
            for split in ("eval", "test"):
                summary.update({f"verdict.{split}.{k}": str(v) for k, v in verdict[split].items()})
        tracking.metrics(metrics, trial["steps"] or 0)
        tracking.summary(summary)
        tracking.files(files)
        reported.update(tracking.close(finished=True))
        ctx.store.put_bytes(tracking_key(trial["id"]), dumps({**tracking.ids, "reported": sorted(reported)}))
