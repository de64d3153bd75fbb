"""Judging a trial against the baseline on one split: paired intervals for every metric, the verdicts,
and the examples that changed; and, before training, how small a change the splits can show.

    judge(spec, rows, base, trial)               comparison, hypothesis, guardrails, changed examples
    power(spec, baseline tally, sizes)           the smallest change eval and test can show, per verdict metric

The power estimate (documented in docs/verdicts.md): the baseline's own bootstrap half-width on eval
combined, as if independent, with the widest half-width a trial could have (a rate near 0.5 over the
examples the metric counts: a trial is not measured yet), scaled by sqrt(n_eval / n_test) for the test
split. Independence overstates the interval when a trial agrees with the baseline on many examples.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from entrypoint.evaluation.bootstrap import MIN_CLUSTERS, Bootstrap, compare, resample_sums, spread
from entrypoint.evaluation.tally import Tally
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
    "versus",
]

_EXCERPT = 120  # characters of an example's text shown beside a changed example


def bootstrap_settings(spec: JobSpec) -> Bootstrap:
    """The spec's `evaluation:` settings (procedure.eval_config records the same)."""
    e = spec.evaluation
    return Bootstrap(resamples=e.resamples, confidence=e.confidence, seed=e.seed)


def clusters_of(spec: JobSpec, rows: Sequence[dict]) -> list[str] | None:
    """Each row's cluster (data.cluster_field), or None when examples are resampled one by one."""
    return [row["cluster"] for row in rows] if spec.data.cluster_field else None


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


def judge(spec: JobSpec, rows: Sequence[dict], base: Tally, trial: Tally) -> dict:
    """The trial's outputs against the baseline's on the same rows (each as its task's per-example counts,
    kinds' TaskSide.tally): every metric with its paired interval, the hypothesis verdict, the guardrail
    checks and what changed."""
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


def versus(spec: JobSpec, rows: Sequence[dict], other: Tally, chosen: Tally) -> dict:
    """The primary metric of `chosen` against `other` on the same rows, with its paired interval."""
    metric = spec.hypothesis.metric
    a, b = other, chosen
    c = compare(a, b, [metric], bootstrap_settings(spec), clusters_of(spec, rows))[metric]
    low, high = c["interval"]
    return {**c, "decided": bool(low > 0 or high < 0)}


def power(spec: JobSpec, baseline: Tally, rows: Sequence[dict], n_test: int) -> dict:
    """Per verdict metric, the smallest change the eval and test splits can show (the half-width of its
    interval, estimated as in this module's docstring) against what the spec asks (min_gain, tolerance),
    and roughly how many examples would make it small enough. The hypothesis also gets its `room`, what
    the baseline leaves below the metric's maximum (1.0), and whether min_gain fits in it (`reachable`)."""
    settings = bootstrap_settings(spec)
    computed = baseline.metrics(baseline.counts.sum(0))
    clusters = clusters_of(spec, rows)
    sums = resample_sums(baseline.counts, clusters, settings.resamples, settings.seed)
    drawn = baseline.metrics(sums, resampled=True)
    too_few = clusters is not None and len(set(clusters)) < MIN_CLUSTERS
    n_eval = len(rows)
    asked = [(spec.hypothesis.metric, "hypothesis", spec.hypothesis.min_gain)]
    asked += [(name, "guardrail", g.tolerance) for g in spec.guardrails for name in guardrail_names([g], computed)]
    table = []
    for name, role, wanted in asked:
        counted = baseline.counted[name]  # all examples, or a category's or group's
        # the baseline's measured half-width and a trial's widest (a rate near 0.5), as if independent
        widest = detectable_from_size(counted, settings.confidence) / math.sqrt(2)
        h_eval = math.hypot(spread(drawn[name], settings.confidence), widest)
        h_eval = float("nan") if too_few else h_eval
        # the test split holds each category in the same share (the split is stratified)
        h_test = h_eval * math.sqrt(n_eval / n_test) if n_test else float("nan")
        entry = {
            "metric": name,
            "role": role,
            "asked": wanted,
            "eval": {"examples": counted, "detectable": h_eval},
            "test": {"examples": round(counted * n_test / n_eval), "detectable": h_test},
        }
        if role == "hypothesis" and wanted > 0:  # every metric rentune tallies is a share: at most 1.0
            entry["room"] = max(0.0, 1.0 - float(computed[name]))
            entry["reachable"] = bool(wanted <= entry["room"] + 1e-9)
        if (role == "hypothesis" and wanted == 0) or math.isnan(h_eval) or math.isnan(h_test):
            entry["decidable"] = None  # no minimum gain (any gain whose interval clears 0 holds), or no estimate
        else:
            entry["decidable"] = bool(h_eval <= wanted and h_test <= wanted)
            if not entry["decidable"]:  # in all, every category in its share
                entry["needed"] = {
                    "eval": _needed(n_eval, h_eval, wanted),
                    "test": _needed(n_test, h_test, wanted),
                }
        table.append(entry)
    return {
        "method": "the baseline's bootstrap half-width on eval and a trial's widest (a rate near 0.5), combined as "
        "independent; test scaled by sqrt(n_eval/n_test)",
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
        if m.get("reachable") is False:
            decided = f"NO (cannot hold: the baseline leaves {m['room']:.3f})"
        elif m.get("needed") and m["needed"]["eval"]:
            decided += f" (about {m['needed']['eval']} eval / {m['needed']['test']} test examples in all)"
        lines.append(
            f"{m['metric']:<28} {e['examples']:>6} {t['examples']:>6} {e['detectable']:>10.3f} /{t['detectable']:>9.3f}"
            f" {m['asked']:>7.3f}  {decided}"
        )
    return lines
