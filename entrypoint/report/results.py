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

__all__ = [
    "RESULTS_VERSION",
    "Results",
    "bar_family",
    "checkpoint_summary",
    "config_sha256",
    "limitations",
    "throughput_summary",
]

RESULTS_VERSION = "rentune-results-2"  # 2: verdicts from paired intervals, power, changed examples


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
    limitations: list[str]


def config_sha256(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def bar_family(task: str, metrics: dict[str, float]) -> tuple[str, list[str]]:
    """The per-category (or per-field, per-group) metric the bar plot shows, and its names."""
    family = {"classification": "f1", "extraction": "field_accuracy", "format": "format_valid_rate"}[task]
    names = sorted(n for n in metrics if n.startswith(f"{family}/"))
    if not names:  # no groups: the headline rates side by side
        names = sorted(n for n in metrics if "/" not in n and "@" not in n and 0.0 <= metrics[n] <= 1.0)
    return family, names


def limitations(results: dict, train: dict, baseline_method: str) -> list[str]:
    """What a reader should know before trusting the numbers, from what was observed in this run."""
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
        if m["decidable"] is False:
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
        if record.get("platform_change"):
            notes.append(f"Trial {trial_id} resumed on a different platform: {record['platform_change']['now']}.")
    if results["environment"].get("backend") == "cpu":
        notes.append("Trained on CPU: peak memory figures are process RSS, not a GPU allocator peak.")
    if selected and results["hypothesis"]["task"] != "classification":
        notes.append("Generated outputs are scored with strict JSON parsing: text around the JSON counts as invalid.")
    return notes
