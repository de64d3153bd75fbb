"""The report a person reads and the results a program reads, built from what the phases committed.

report/results.json         machine-readable; `Results` below is its schema (report/results.schema.json)
report/report.md            verdict, comparison table, per-category table, test, guardrails, limitations
report/loss_curves.png      train and eval loss per trial
report/per_category.png     the per-category metric, baseline vs every completed trial (eval split)
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["RESULTS_VERSION", "Results", "bar_family", "limitations", "render_markdown"]

RESULTS_VERSION = "rentune-results-1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Strict):
    reference_examples: int
    planned_examples: int
    done_examples: int
    status: Literal["within", "exceeds", "short"]
    unit: str


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
    hypothesis: dict[str, Any] | None
    guardrails: list[dict[str, Any]]
    guardrails_passed: bool | None
    eval_config_sha256: str | None
    losses: list[dict[str, float]]
    eval_losses: list[dict[str, float]]


class SplitVerdict(_Strict):
    hypothesis_holds: bool
    gain: float
    guardrails_passed: bool


class TestResult(_Strict):
    test_sha256: str
    examples: int
    override: dict[str, Any] | None
    baseline: dict[str, float]
    trial: dict[str, float]
    guardrails: list[dict[str, Any]]


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
    selected: dict[str, str]
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


def _half_width(p: float, n: int) -> float:
    """95% normal-approximation half-width of a rate measured on n examples."""
    return 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n) if n else float("nan")


def limitations(results: dict, train: dict, baseline_method: str) -> list[str]:
    """What a reader should know before trusting the numbers, from what was observed in this run."""
    notes = []
    test, selected = results["test"], results["selected"]["trial_id"]
    metric = results["hypothesis"]["metric"]
    n = test["examples"]
    p = test["trial"][metric]
    notes.append(
        f"The sealed test split has {n} examples: a rate of {p:.3f} there is uncertain by about "
        f"+/-{_half_width(p, n):.3f} (95%, normal approximation); smaller differences are not evidence."
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
        if trial["guardrails_passed"] is False:
            failed = [g["metric"] for g in trial["guardrails"] if not g["passed"]]
            notes.append(f"Trial {trial['id']} fails guardrails on eval: {', '.join(failed)}.")
    if not results["eval_configs_identical"]:
        notes.append("The trials' stored eval configs differ: their metrics are not directly comparable.")
    eval_gain, test_gain = results["verdict"]["eval"]["gain"], results["verdict"]["test"]["gain"]
    if test_gain < eval_gain:
        notes.append(
            f"The selected trial's gain is smaller on test ({test_gain:+.3f}) than on eval ({eval_gain:+.3f}): "
            "selecting on eval favours trials that got lucky there."
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


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_markdown(results: dict) -> str:
    """report.md: verdict first, then the evidence, limitations last."""
    h, sel = results["hypothesis"], results["selected"]["trial_id"]
    metric = h["metric"]
    ev, te = results["verdict"]["eval"], results["verdict"]["test"]
    lines = [
        f"# rentune report: {results['job']['id']}",
        "",
        f"**Hypothesis** ({h['task']}): {h['statement']}",
        "",
        f"- Primary metric `{metric}`, minimum gain {h['min_gain']:.3f} over the untouched base model.",
        f"- Selected trial: **{sel}** ({results['selected']['why']}).",
        f"- Eval: hypothesis **{'holds' if ev['hypothesis_holds'] else 'does not hold'}** (gain {ev['gain']:+.3f}); "
        f"guardrails **{'pass' if ev['guardrails_passed'] else 'FAIL'}**.",
        f"- Sealed test (opened once): hypothesis **{'holds' if te['hypothesis_holds'] else 'does not hold'}** "
        f"(gain {te['gain']:+.3f}); guardrails **{'pass' if te['guardrails_passed'] else 'FAIL'}**.",
        "",
        "## Trials (eval split)",
        "",
        f"| trial | reference | change | status | {metric} | gain | guardrails | budget |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base_value = results["baseline"]["metrics"][metric]
    lines.append(f"| baseline | - | untouched base model | - | {base_value:.3f} | - | - | - |")
    for t in results["trials"]:
        value = t["metrics"][metric] if t["metrics"] else None
        gain = "-" if value is None else f"{value - base_value:+.3f}"
        guard = "-" if t["guardrails_passed"] is None else ("pass" if t["guardrails_passed"] else "FAIL")
        status = t["status"] if not t["reason"] else f"{t['status']}: {t['reason']}"
        change = ", ".join(t["changes"]) or "spec settings"
        lines.append(
            f"| {t['id']}{' (selected)' if t['id'] == sel else ''} | {t['reference'] or '-'} | {change} | "
            f"{status.replace('|', '/')} | {_fmt(value)} | {gain} | {guard} | {t['budget']['status']} |"
        )
    completed = [t for t in results["trials"] if t["metrics"]]
    family, names = bar_family(h["task"], results["baseline"]["metrics"])
    lines += [
        "",
        f"## Per category: `{family}` on eval",
        "",
        "| metric | baseline | " + " | ".join(t["id"] for t in completed) + " |",
    ]
    lines.append("|---|---|" + "---|" * len(completed))
    for name in names:
        row = [_fmt(results["baseline"]["metrics"].get(name))] + [_fmt(t["metrics"].get(name)) for t in completed]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    test = results["test"]
    lines += [
        "",
        f"## Sealed test split ({test['examples']} examples, sha256 {test['test_sha256'][:16]})",
        "",
        f"| metric | baseline | {sel} | change |",
        "|---|---|---|---|",
    ]
    for name in [metric, *[n for n in names if n != metric]]:
        before, after = test["baseline"].get(name), test["trial"].get(name)
        change = "-" if before is None or after is None else f"{after - before:+.3f}"
        lines.append(f"| {name} | {_fmt(before)} | {_fmt(after)} | {change} |")
    if test["override"]:
        lines += ["", f"**The test split was reopened on request:** {test['override']['reason']}"]
    selected = next(t for t in results["trials"] if t["id"] == sel)
    lines += ["", f"## Guardrails for {sel}", ""]
    if not results["guardrails"]:
        lines.append("No guardrails were declared in the spec.")
    else:
        lines += [
            "| split | metric | baseline | trial | change | tolerance | result |",
            "|---|---|---|---|---|---|---|",
        ]
        for split, checks in (("eval", selected["guardrails"]), ("test", test["guardrails"])):
            for g in checks:
                lines.append(
                    f"| {split} | {g['metric']} | {g['baseline']:.3f} | {g['trial']:.3f} | {g['change']:+.3f} | "
                    f"{g['tolerance']:.3f} | {'pass' if g['passed'] else 'FAIL'} |"
                )
    lines += [
        "",
        "## Plots",
        "",
        "![loss per trial](loss_curves.png)",
        "",
        f"![{family} per category](per_category.png)",
        "",
        "## Observed limitations",
        "",
        *[f"- {note}" for note in results["limitations"]],
        "",
    ]
    return "\n".join(lines)
