"""Judging a trial against the baseline on one split: paired intervals for every metric, the verdicts,
and the examples that changed; and, before training, how small a change the splits can show.

    tally_of(spec, rows, outputs, labels)        per-example counts of the task's metrics (tally.py)
    judge(spec, rows, labels, before, after)     comparison, hypothesis, guardrails, changed examples
    power(spec, baseline tally, sizes)           the smallest change eval and test can show, per verdict metric

The power estimate (documented in docs/verdicts.md): the baseline's own bootstrap spread on eval, times
sqrt(2) (a trial as variable as the baseline and uncorrelated with it: usually a slight overestimate, as
a trial agrees with the baseline on many examples), scaled by sqrt(n_eval / n_test) for the test split.
A baseline whose results do not vary (every answer wrong) says nothing of a trial's spread: then the
trial's alone is taken at its widest, a rate near 0.5 over the examples the metric counts.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from entrypoint.evaluation.bootstrap import Bootstrap, compare, resample_sums, spread
from entrypoint.evaluation.formats import extraction_report, format_report
from entrypoint.evaluation.tally import Tally, classification_tally, extraction_tally, format_tally
from entrypoint.evaluation.verdict import check_guardrails, guardrail_names, hypothesis_verdict, overall
from jobspec.plan import detectable_from_size
from jobspec.schema import JobSpec

__all__ = [
    "bootstrap_settings",
    "clusters_of",
    "excerpt",
    "judge",
    "power",
    "power_lines",
    "tally_of",
    "verdict_names",
    "versus",
]

_EXCERPT = 120  # characters of an example's text shown beside a changed example
_SHOWN = 10  # changed examples each way in report.md


def bootstrap_settings(spec: JobSpec) -> Bootstrap:
    e = spec.evaluation
    return Bootstrap(resamples=e.resamples, confidence=e.confidence, seed=e.seed)


def clusters_of(spec: JobSpec, rows: Sequence[dict]) -> list[str] | None:
    """Each row's cluster (data.cluster_field), or None when examples are resampled one by one."""
    return [row["cluster"] for row in rows] if spec.data.cluster_field else None


def tally_of(spec: JobSpec, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> Tally:
    """The task's per-example counts for these outputs (the same definitions as procedure.score)."""
    task = spec.hypothesis.task
    if task == "classification":
        return classification_tally([r["label"] for r in rows], outputs, labels)
    groups = [r["label"] for r in rows] if len(set(labels)) > 1 else None
    if task == "format":
        rule = spec.hypothesis.format
        report = format_report(
            outputs, json_schema=rule.json_schema, regex=rule.regex, expect_json=rule.expect_json, groups=groups
        )
        return format_tally(report["examples"], list(report["metrics"]), groups)
    report = extraction_report(
        outputs,
        [json.loads(r["response"]) for r in rows],
        required_fields=spec.hypothesis.required_fields,
        fields=spec.hypothesis.fields,
        groups=groups,
    )
    return extraction_tally(report["examples"], report["fields"], report["required_fields"], groups)


def verdict_names(spec: JobSpec, computed) -> list[str]:
    """The metrics the verdict uses: the primary one, then every guardrail's."""
    return list(dict.fromkeys([spec.hypothesis.metric, *guardrail_names(spec.guardrails, computed)]))


def excerpt(row: dict) -> str:
    """A short text that identifies an example for a reader."""
    if "text" in row or "prompt" in row:
        text = row.get("text", row.get("prompt"))
    elif "messages" in row:
        users = [m["content"] for m in row["messages"] if m.get("role") == "user"]
        text = users[-1] if users else json.dumps(row["messages"][-1], ensure_ascii=False)
    else:
        text = row.get("image") or row.get("path") or json.dumps(row, ensure_ascii=False)
    text = " ".join(str(text).split())
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


def _changed(before: Tally, after: Tally, rows: Sequence[dict]) -> dict:
    """Examples whose own score rose (fixed) or fell (broken), counted per category or group."""
    delta = after.scores - before.scores
    records = {"fixed": np.flatnonzero(delta > 0), "broken": np.flatnonzero(delta < 0)}
    groups = sorted(set(after.groups))
    per_group = {g: {"fixed": 0, "broken": 0} for g in groups}
    examples = {}
    for way, positions in records.items():
        examples[way] = []
        for i in positions.tolist():
            per_group[after.groups[i]][way] += 1
            examples[way].append(
                {
                    "row": i,
                    "group": after.groups[i],
                    "before": float(before.scores[i]),
                    "after": float(after.scores[i]),
                    "excerpt": excerpt(rows[i]),
                }
            )
    fixed, broken = len(examples["fixed"]), len(examples["broken"])
    return {
        "fixed": fixed,
        "broken": broken,
        "per_group": per_group,
        "examples": examples,
        "concentration": _concentration(examples),
    }


def _concentration(examples: dict) -> str:
    """One sentence on where the change comes from, e.g. "40 fixed against 3 broken; 17 of the fixed are billing"."""
    fixed, broken = examples["fixed"], examples["broken"]
    if not fixed and not broken:
        return "no example changed"
    text = f"{len(fixed)} example(s) fixed against {len(broken)} broken"
    for way, items in (("fixed", fixed), ("broken", broken)):
        if len(items) >= 3:
            group, count = Counter(e["group"] for e in items).most_common(1)[0]
            if group != "all" and count / len(items) >= 0.4:
                text += f"; {count} of the {way} are {group}"
    return text


def judge(
    spec: JobSpec,
    rows: Sequence[dict],
    labels: Sequence[str],
    before: Sequence[str],
    after: Sequence[str],
) -> dict:
    """The trial's outputs `after` against the baseline's `before` on the same rows: every metric with its
    paired interval, the hypothesis verdict, the guardrail checks and what changed."""
    base, trial = tally_of(spec, rows, before, labels), tally_of(spec, rows, after, labels)
    names = list(base.metrics(base.counts.sum(0)))
    comparison = compare(base, trial, names, bootstrap_settings(spec), clusters_of(spec, rows))
    guardrails = check_guardrails(spec.guardrails, comparison)
    return {
        "comparison": comparison,
        "hypothesis": hypothesis_verdict(spec.hypothesis, comparison),
        "guardrails": guardrails,
        "guardrails_result": overall(guardrails),
        "changed": _changed(base, trial, rows),
    }


def versus(
    spec: JobSpec, rows: Sequence[dict], labels: Sequence[str], other: Sequence[str], chosen: Sequence[str]
) -> dict:
    """The primary metric of `chosen` against `other` on the same rows, with its paired interval."""
    metric = spec.hypothesis.metric
    a, b = tally_of(spec, rows, other, labels), tally_of(spec, rows, chosen, labels)
    c = compare(a, b, [metric], bootstrap_settings(spec), clusters_of(spec, rows))[metric]
    low, high = c["interval"]
    return {**c, "decided": bool(low > 0 or high < 0)}


def power(spec: JobSpec, baseline: Tally, rows: Sequence[dict], n_test: int) -> dict:
    """Per verdict metric, the smallest change the eval and test splits can show (the half-width of its
    interval, estimated as in this module's docstring) against what the spec asks (min_gain, tolerance),
    and roughly how many examples would make it small enough."""
    settings = bootstrap_settings(spec)
    computed = baseline.metrics(baseline.counts.sum(0))
    drawn = baseline.metrics(resample_sums(baseline.counts, clusters_of(spec, rows), settings.resamples, settings.seed))
    n_eval = len(rows)
    asked = {spec.hypothesis.metric: ("hypothesis", spec.hypothesis.min_gain)}
    for g in spec.guardrails:
        for name in guardrail_names([g], computed):
            asked.setdefault(name, ("guardrail", g.tolerance))
    table = []
    sizes = Counter(baseline.groups)
    for name, (role, wanted) in asked.items():
        # the examples a metric counts: its category's or group's (f1/billing, field_accuracy@email), else all;
        # the test split holds each category in the same share (the split is stratified)
        group = name.split("/", 1)[-1] if "/" in name else name.split("@", 1)[-1] if "@" in name else None
        counted = sizes.get(group, n_eval)
        h_eval = math.sqrt(2) * spread(drawn[name], settings.confidence)
        if h_eval == 0:  # the baseline's results do not vary (all wrong, say): only the trial's variance counts,
            # taken at its widest (a rate near 0.5)
            h_eval = detectable_from_size(counted, settings.confidence) / math.sqrt(2)
        h_test = h_eval * math.sqrt(n_eval / n_test) if n_test else float("nan")
        entry = {
            "metric": name,
            "role": role,
            "asked": wanted,
            "eval": {"examples": counted, "detectable": h_eval},
            "test": {"examples": round(counted * n_test / n_eval), "detectable": h_test},
        }
        if role == "hypothesis" and wanted == 0:
            entry["decidable"] = None  # no minimum gain: any gain whose interval clears 0 holds
        elif math.isnan(h_eval):
            entry["decidable"] = None
        else:
            entry["decidable"] = bool(h_eval <= wanted and h_test <= wanted)
            if not entry["decidable"]:  # in all, every category in its share
                entry["needed"] = {
                    "eval": _needed(n_eval, h_eval, wanted),
                    "test": _needed(n_test, h_test, wanted),
                }
        table.append(entry)
    return {
        "method": "sqrt(2) x the baseline's bootstrap half-width on eval; test scaled by sqrt(n_eval/n_test)",
        "confidence": settings.confidence,
        "metrics": table,
    }


def _needed(n: int, detectable: float, wanted: float) -> int | None:
    """Examples for a half-width of `wanted` (half-widths shrink as 1/sqrt(n)); None when nothing suffices."""
    if wanted <= 0:
        return None
    return max(n, math.ceil(n * (detectable / wanted) ** 2))


def power_lines(table: dict) -> list[str]:
    """The power table as printed: metric, examples, the smallest change each split can show, what was asked."""
    lines = [f"{'metric':<28} {'eval':>6} {'test':>6} {'detectable eval/test':>21} {'asked':>7}  decidable"]
    for m in table["metrics"]:
        e, t = m["eval"], m["test"]
        decided = {True: "yes", False: "NO", None: "-"}[m["decidable"]]
        if m.get("needed") and m["needed"]["eval"]:
            decided += f" (about {m['needed']['eval']} eval / {m['needed']['test']} test examples in all)"
        lines.append(
            f"{m['metric']:<28} {e['examples']:>6} {t['examples']:>6} {e['detectable']:>10.3f} /{t['detectable']:>9.3f}"
            f" {m['asked']:>7.3f}  {decided}"
        )
    return lines
