"""Report phase: results.json (with its JSON Schema), report.md and the PNG plots, from what the earlier
phases committed. Pure bookkeeping: no model is loaded, so it is cheap to run again."""

from __future__ import annotations

from entrypoint.context import PhaseContext
from entrypoint.errors import InvalidInput
from entrypoint.job import layout
from entrypoint.job.attempts import previous_attempts
from entrypoint.job.lease import lease_account
from entrypoint.job.state import dumps
from entrypoint.report.markdown import render_markdown
from entrypoint.report.plots import category_bars_png, loss_curves_png
from entrypoint.report.results import Results, bar_family, build_results
from entrypoint.tracking import RunRef, open_tracking, stored_ids
from entrypoint.training.environment import environment

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    baseline, train = ctx.result("baseline"), ctx.result("train")
    evaluated, test = ctx.result("evaluate"), ctx.result("test")
    selected = evaluated["selected"]
    if "runner_up" not in evaluated or "comparison" not in test:
        raise InvalidInput(
            "report: phases/evaluate and phases/test were committed by an earlier rentune that compared point "
            f"estimates; their stored predictions remain. Delete {layout.phase_result('evaluate')} and "
            f"{layout.phase_result('test')} (and the test's seal, sealed-tests/..., or pass --reopen-test) to judge "
            "them again with intervals, or run the spec under a new job.id"
        )

    records = {t: ctx.read_json(layout.trial_result(t)) for t in train["order"]}
    configs = {
        t: ctx.read_json(layout.trial_eval(t, "eval_config.json")) if "metrics" in evaluated["trials"][t] else None
        for t in train["order"]
    }
    committed = {"data": ctx.data_result, "baseline": baseline, "train": train, "evaluate": evaluated, "test": test}
    results = build_results(spec, ctx.spec_sha256, committed, records, configs, environment(), ctx.kind.task)
    results["lease"] = lease_account(spec, ctx.store, ctx.clock())
    if spec.adaptation.quantization is not None:
        results["quantization"] = {
            "base": ctx.recorded_quantization(),
            "memory": ctx.result("probe").get("quantization"),
        }
    this = {"attempt": ctx.attempt, "outcome": "running", "phase": "report", "error": None}
    results["attempts"] = [*previous_attempts(ctx.store, ctx.attempt), this]
    trials = results["trials"]
    Results.model_validate(results)  # the schema we publish is the one we write

    curves = {
        t["id"]: {
            "train": [(p["step"], p["loss"]) for p in t["losses"]],
            "eval": [(p["step"], p["loss"]) for p in t["eval_losses"]],
            "resumed": [i["resumed_from_step"] for i in t["interruptions"]],
        }
        for t in trials
    }
    family, names = bar_family(ctx.kind.task.breakdown, baseline["metrics"])
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
        ctx.store.put_bytes(layout.report_file(name), data)
        (local / name).write_bytes(data)
    ctx.log(f"report: {ctx.store.uri}/report/report.md ({len(results['limitations'])} limitations noted)")
    _track(ctx, results, [local / name for name in files if name != "results.schema.json"])
    return {"selected": selected, "verdict": results["verdict"], "files": sorted(_files(ctx))}


def _files(ctx: PhaseContext) -> list[str]:
    return [info.key for info in ctx.store.list(layout.REPORT)]


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
        ctx.store.put_bytes(layout.trial_tracking(trial["id"]), dumps({**tracking.ids, "reported": sorted(reported)}))
