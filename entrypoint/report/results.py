"""The results a program reads, built from what the phases committed, and the limitations they show
(report.md is rendered from them in markdown.py; the plots in plots.py).

report/results.json         machine-readable; `Results` below is its schema (report/results.schema.json)
report/report.md            verdict, comparison table, per-category table, test, guardrails, limitations
report/loss_curves.png      train and eval loss per trial
report/per_category.png     the per-category metric, baseline vs every completed trial (eval split)
"""

from __future__ import annotations

import hashlib
import json
import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from entrypoint.evaluation.verdict import RULES
from jobspec.schema import JobSpec

__all__ = [
    "RESULTS_VERSION",
    "Results",
    "bar_family",
    "build_results",
    "checkpoint_summary",
    "config_sha256",
    "limitations",
    "split_verdict",
    "throughput_summary",
]

# 2: verdicts from paired intervals, power, changed examples; 3: the lease (plan against actual)
RESULTS_VERSION = "rentune-results-3"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Strict):
    reference_examples: int
    planned_examples: int
    done_examples: int
    status: Literal["within", "exceeds", "short"]
    unit: str


class CheckpointSummary(_Strict):
    """The checkpoints of the process that finished the trial (earlier attempts' are not counted)."""

    committed: int
    bytes: int | None  # of the newest checkpoint
    blocked_s_median: float | None  # the training loop's wait per checkpoint: local save, then any commit
    commit_s_median: float | None  # upload, confirmation and manifest, in the background but for the last
    failed: int
    interval: dict[str, Any] | None  # every_minutes: auto: the chosen interval and the measured cost


class ThroughputSummary(_Strict):
    """How fast the process that finished the trial trained (after its first logging window)."""

    tokens_per_s: float | None  # non-padding tokens, all processes
    tokens_per_s_per_device: float | None
    padding_share: float | None  # of the tokens the model computed on
    mfu: float | None  # on a GPU with a known peak; model FLOPs as entrypoint/training/throughput.py counts them
    flops_per_token: float | None
    peak_flops_per_device: float | None
    peak_source: str | None
    precision: str | None  # training.precision as resolved on the device
    attn_implementation: str | None
    packing: bool
    liger: bool


Verdict3 = Literal["pass", "fail", "inconclusive"]


class TrialResult(_Strict):
    id: str
    reference: str | None
    changes: list[str]
    rationale: str
    status: Literal["completed", "stopped", "invalid"]
    reason: str | None
    steps: int | None
    planned_steps: int | None
    budget: Budget
    metrics: dict[str, float] | None  # eval split; None unless completed
    hypothesis: dict[str, Any] | None  # gain, its interval, result: holds / does not hold / inconclusive
    guardrails: list[dict[str, Any]]  # per metric: change, interval, tolerance, result
    guardrails_result: Verdict3 | None
    comparison: dict[str, dict[str, Any]] | None  # every metric against the baseline, with its interval
    changed: dict[str, Any] | None  # examples fixed and broken against the baseline
    eval_config_sha256: str | None
    losses: list[dict[str, float]]
    eval_losses: list[dict[str, float]]
    checkpoints: CheckpointSummary | None
    throughput: ThroughputSummary | None
    # each earlier process of this trial that stopped before its end: reached_step, resumed_from_step, lost_steps
    interruptions: list[dict[str, Any]] = []


def throughput_summary(record: dict) -> dict | None:
    """A trial's ThroughputSummary from its result.json (None for a trial that never trained here)."""
    measured = record.get("throughput")
    if measured is None:
        return None
    keys = ("tokens_per_s", "tokens_per_s_per_device", "padding_share", "mfu", "flops_per_token")
    return {
        **{k: measured.get(k) for k in keys},
        "peak_flops_per_device": measured.get("peak_flops_per_device"),
        "peak_source": measured.get("peak_source"),
        "precision": record.get("precision"),
        "attn_implementation": record.get("attn_implementation"),
        "packing": bool(record.get("settings", {}).get("training", {}).get("packing")),
        "liger": bool(record.get("liger")),
    }


def checkpoint_summary(record: dict) -> dict | None:
    """A trial's CheckpointSummary from its result.json (None for a trial that never trained here)."""
    records = record.get("checkpoints")
    if records is None:
        return None
    done = [r for r in records if r.get("commit_s") is not None]

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    return {
        "committed": len(done),
        "bytes": done[-1]["bytes"] if done else None,
        "blocked_s_median": median([r["blocked_s"] for r in records if "blocked_s" in r]),
        "commit_s_median": median([r["commit_s"] for r in done]),
        "failed": sum(1 for r in records if r.get("error")),
        "interval": record.get("checkpoint_interval"),
    }


class SplitVerdict(_Strict):
    hypothesis: Literal["holds", "does not hold", "inconclusive"]
    gain: float
    interval: list[float]  # of the gain, at `confidence`
    min_gain: float
    guardrails: Verdict3


class TestResult(_Strict):
    test_sha256: str
    examples: int
    override: dict[str, Any] | None
    baseline: dict[str, float]
    trial: dict[str, float]
    guardrails: list[dict[str, Any]]
    comparison: dict[str, dict[str, Any]]
    changed: dict[str, Any]


class Results(_Strict):
    """Schema of report/results.json."""

    results_version: str
    job: dict[str, Any]
    hypothesis: dict[str, Any]
    guardrails: list[dict[str, Any]]
    data: dict[str, Any]
    baseline: dict[str, Any]
    trials: list[TrialResult]
    eval_configs_identical: bool
    selected: dict[str, Any]  # trial_id, why, runner_up (its paired interval against the selected trial)
    intervals: dict[str, Any]  # how every interval was computed (method, resamples, confidence, seed, unit)
    rules: str  # the verdict rules, in words
    power: dict[str, Any]  # the smallest change eval and test can show per verdict metric, before training
    verdict: dict[Literal["eval", "test"], SplitVerdict]
    test: TestResult
    environment: dict[str, Any]
    # Plan against actual per phase and trial, and the lease used (entrypoint/job/lease.py); the report and
    # export phases run after the report, so their actual seconds are in `rentune status`, not here.
    lease: dict[str, Any] | None = None
    # QLoRA: the quantized base as base_model.json recorded it, and the probe's memory against unquantized
    quantization: dict[str, Any] | None = None
    # every process that ran this job: attempt, outcome (completed, interrupted, error, killed), phase, error
    attempts: list[dict[str, Any]] | None = None
    limitations: list[str]


def build_results(
    spec: JobSpec,
    spec_sha256: str,
    committed: dict[str, dict],
    records: dict[str, dict],
    configs: dict[str, dict | None],
    env: dict,
    task,
) -> dict:
    """results.json from what the phases committed: `committed` (the data, baseline, train, evaluate and
    test phases' results), each trial's record (trials/<id>/result.json) and eval config (None when it was
    not evaluated), the environment and the task side (kinds' TaskSide: the breakdown metric and its
    notes)."""
    data, baseline, train = committed["data"], committed["baseline"], committed["train"]
    evaluated, test = committed["evaluate"], committed["test"]
    selected = evaluated["selected"]
    trials = []
    for trial_id in train["order"]:
        record, scored, config = records[trial_id], evaluated["trials"][trial_id], configs[trial_id]
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
                "interruptions": record.get("interruptions") or [],
            }
        )
    chosen = evaluated["trials"][selected]
    results = {
        "results_version": RESULTS_VERSION,
        "job": {"id": spec.job.id, "description": spec.job.description, "spec_sha256": spec_sha256},
        "hypothesis": {
            **spec.hypothesis.model_dump(include={"task", "statement", "metric", "min_gain"}),
            "breakdown": task.breakdown,
        },
        "guardrails": [g.model_dump() for g in spec.guardrails],
        "data": {"data_version": data["data_version"], "counts": data["counts"], "leaks": data["leaks"]["counts"]},
        "baseline": {"method": baseline["eval_config"]["baseline"]["method"], "metrics": baseline["metrics"]},
        "trials": trials,
        "eval_configs_identical": len({config_sha256(c) for c in configs.values() if c is not None}) <= 1,
        "selected": {"trial_id": selected, "why": evaluated["selection"], "runner_up": evaluated["runner_up"]},
        "intervals": evaluated["eval_config"]["intervals"],
        "rules": RULES,
        "power": baseline["power"],
        "verdict": {"eval": split_verdict(chosen), "test": split_verdict(test)},
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
    results["limitations"] = limitations(results, records, results["baseline"]["method"], task.notes())
    return results


def split_verdict(scored: dict) -> dict:
    """The verdict on one split: the hypothesis' result, the gain and its interval, the guardrails' result."""
    h = scored["hypothesis"]
    return {
        "hypothesis": h["result"],
        "gain": h["gain"],
        "interval": h["interval"],
        "min_gain": h["min_gain"],
        "guardrails": scored["guardrails_result"],
    }


def config_sha256(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


# The breakdown metrics of the tasks (kinds' TaskSide.breakdown), for results.json files that do not name theirs.
BREAKDOWNS = ("f1", "field_accuracy", "format_valid_rate")


def bar_family(family: str | None, metrics: dict[str, float]) -> tuple[str, list[str]]:
    """The per-category (or per-field, per-group) metric the bar plot shows (`family`: the task side's
    breakdown, results["hypothesis"]["breakdown"]; None in results of an earlier rentune), and its names."""
    if family is None:  # results of an earlier rentune: the breakdown its metrics hold, if any
        family = next((f for f in BREAKDOWNS if any(n.startswith(f"{f}/") for n in metrics)), "metric")
    names = sorted(n for n in metrics if n.startswith(f"{family}/"))
    if not names:  # no groups: the headline rates side by side
        names = sorted(n for n in metrics if "/" not in n and "@" not in n and 0.0 <= metrics[n] <= 1.0)
    return family, names


def _still_open(results: dict, power: dict) -> bool:
    """Whether a verdict on the power table's metric stayed inconclusive on eval or test: a note that it
    could stay so never sits under a verdict that decided it."""
    if power["role"] == "hypothesis":
        return any(results["verdict"][split]["hypothesis"] == "inconclusive" for split in ("eval", "test"))
    chosen = next((t for t in results["trials"] if t["id"] == results["selected"]["trial_id"]), {})
    checks = [*chosen.get("guardrails", []), *results["test"]["guardrails"]]
    return any(c["metric"] == power["metric"] and c["result"] == "inconclusive" for c in checks) or not checks


def limitations(results: dict, train: dict, baseline_method: str, task_notes: list[str]) -> list[str]:
    """What a reader should know before trusting the numbers, from what was observed in this run
    (`task_notes`: the task side's own, shown when a trial was selected)."""
    notes = []
    test, selected = results["test"], results["selected"]["trial_id"]
    metric = results["hypothesis"]["metric"]
    level = f"{results['intervals']['confidence']:.0%}"
    for split in ("eval", "test"):
        v = results["verdict"][split]
        if v["hypothesis"] == "inconclusive":
            low, high = v["interval"]
            notes.append(
                f"On {split} the {metric} gain's {level} interval [{low:+.3f}, {high:+.3f}] includes min_gain "
                f"{v['min_gain']:.3f}: the hypothesis is neither shown nor refuted there; more examples would "
                "decide it."
            )
    for m in results["power"]["metrics"]:
        if m.get("reachable") is False:
            notes.append(
                f"Before training, the baseline's {m['metric']} left {m['room']:.3f} below its maximum of 1.0, less "
                f"than the {m['asked']:.3f} asked: the hypothesis could not hold, whatever the training."
            )
        elif m["decidable"] is False and _still_open(results, m):
            notes.append(
                f"Before training, {m['metric']} ({m['role']}) could only show changes larger than "
                f"{m['eval']['detectable']:.3f} on eval and {m['test']['detectable']:.3f} on test, more than the "
                f"{m['asked']:.3f} asked: its verdicts may stay inconclusive."
            )
    runner_up = results["selected"].get("runner_up")
    if runner_up and not runner_up["decided"]:
        low, high = runner_up["interval"]
        notes.append(
            f"The selected trial {selected} beats the runner-up {runner_up['trial_id']} on eval by "
            f"{runner_up['change']:+.3f} [{low:+.3f}, {high:+.3f}]: the choice between them is not decided."
        )
    if baseline_method == "zero_shot_similarity":
        notes.append(
            "The baseline is the untouched encoder's zero-shot similarity to the category descriptions; a "
            "better description list would give a stronger baseline."
        )
    for trial in results["trials"]:
        if trial["status"] != "completed":
            notes.append(f"Trial {trial['id']} is {trial['status']}: {trial['reason']}.")
        elif trial["budget"]["status"] != "within":
            b = trial["budget"]
            notes.append(
                f"Trial {trial['id']} {b['status']} the training budget: {b['done_examples']} examples processed "
                f"vs {b['reference_examples']} for main; its comparison is not at equal budget."
            )
        if trial["guardrails_result"] == "fail":
            failed = [g["metric"] for g in trial["guardrails"] if g["result"] == "fail"]
            notes.append(f"Trial {trial['id']} fails guardrails on eval: {', '.join(failed)}.")
    if not results["eval_configs_identical"]:
        notes.append("The trials' stored eval configs differ: their metrics are not directly comparable.")
    eval_gain, test_verdict = results["verdict"]["eval"]["gain"], results["verdict"]["test"]
    if eval_gain > test_verdict["interval"][1]:  # beyond what the test split itself makes plausible
        notes.append(
            f"The selected trial's gain on eval ({eval_gain:+.3f}) is above its test interval "
            f"[{test_verdict['interval'][0]:+.3f}, {test_verdict['interval'][1]:+.3f}]: selecting on eval favours "
            "trials that got lucky there."
        )
    if test["override"]:
        notes.append(f"The test split had been opened before; it was reopened on request: {test['override']['reason']}")
    for trial_id, record in train.items():
        interruptions = record.get("interruptions") or []
        if interruptions:
            lost = ", ".join(str(i["lost_steps"]) for i in interruptions)
            notes.append(
                f"Trial {trial_id} was interrupted {len(interruptions)} time(s); steps lost to each: {lost} (from "
                "the step each process last recorded, every few seconds: at least that many)."
            )
        if record.get("platform_change"):
            notes.append(f"Trial {trial_id} resumed on a different platform: {record['platform_change']['now']}.")
    if results["environment"].get("backend") == "cpu":
        notes.append("Trained on CPU: peak memory figures are process RSS, not a GPU allocator peak.")
    if selected:
        notes.extend(task_notes)
    return notes
