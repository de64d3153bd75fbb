"""Every metric of a report as a function of per-example counts, so the bootstrap can resample examples.

Each metric rentune computes is a ratio of sums over examples of small integers: a classification's
per-category true positives, predictions and gold counts; format checks passed; extraction fields right.
A `Tally` holds those integers per example (`counts`, one row per example) and the function that turns
their column sums into every metric of the report (`metrics`). The sums of one resample give that
resample's metrics; the sums of all rows give the report's own values (a unit test holds every task to
that, name by name).

    counts  (n, m) int      one row per example
    metrics(sums, resampled=False)
                            sums: (..., m) -> {name: (...) values}, the report's names exactly
    counted                 per metric, how many examples it counts (all, a category's, a group's): power
    outcomes                binary-outcome metrics (accuracy, json_valid_rate, ...): the column of each
                            example's 0/1 outcome and the column saying which examples count (None: all),
                            for the exact McNemar test on discordant pairs
    scores  (n,) float      each example's own score (correct, valid, share of fields right): what changed
    groups  (n,) str        each example's category or group, for the counts of what changed

A ratio with nothing to count (a group absent from a resample) is NaN, and NaN draws are left out of an
interval. The F1 of a category with no gold and no predicted example is 0 in a report; in a resample
(`resampled=True`) a category with no gold example gets NaN F1 and recall, so that draws which happen to
miss a small category do not pull its interval towards "no change". Macro-F1 keeps the report's 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Tally", "classification_tally", "extraction_tally", "format_tally"]


@dataclass(frozen=True)
class Tally:
    counts: np.ndarray
    metrics: Callable[..., dict[str, np.ndarray]]
    outcomes: dict[str, tuple[int, int | None]]
    scores: np.ndarray
    groups: list[str]
    counted: dict[str, int]


class _Columns:
    """Named integer columns, added one at a time."""

    def __init__(self, n: int):
        self.n, self.columns = n, []

    def add(self, values) -> int:
        column = np.asarray(values, dtype=np.int64).reshape(self.n)
        self.columns.append(column)
        return len(self.columns) - 1

    def matrix(self) -> np.ndarray:
        return np.stack(self.columns, axis=1)


def _ratio(numerator: np.ndarray, denominator: np.ndarray, empty: float = np.nan) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), empty)


def classification_tally(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> Tally:
    """Per example: gold one-hot, predicted one-hot (zero for a label outside `labels`), true-positive
    one-hot. Gives every metric of metrics.classification_report."""
    labels = list(labels)
    index = {label: i for i, label in enumerate(labels)}
    n, c = len(gold), len(labels)
    g = np.array([index[x] for x in gold])
    p = np.array([index.get(x, -1) for x in pred])
    gold_hot = np.zeros((n, c), dtype=np.int64)
    gold_hot[np.arange(n), g] = 1
    pred_hot = np.zeros((n, c), dtype=np.int64)
    known = p >= 0
    pred_hot[np.arange(n)[known], p[known]] = 1
    correct = (g == p).astype(np.int64)
    counts = np.concatenate([gold_hot, pred_hot, gold_hot * pred_hot, correct[:, None]], axis=1)

    def metrics(sums: np.ndarray, resampled: bool = False) -> dict[str, np.ndarray]:
        gold_c, pred_c, tp_c = sums[..., :c], sums[..., c : 2 * c], sums[..., 2 * c : 3 * c]
        precision, recall = _ratio(tp_c, pred_c, 0.0), _ratio(tp_c, gold_c, 0.0)
        f1 = _ratio(2 * tp_c, gold_c + pred_c, 0.0)  # = 2PR/(P+R), and 0 when tp is 0
        absent = gold_c == 0 if resampled else np.zeros_like(gold_c, dtype=bool)
        n_all, tp, predicted = gold_c.sum(-1), tp_c.sum(-1), pred_c.sum(-1)
        out = {
            "accuracy": _ratio(sums[..., 3 * c], n_all),
            "macro_f1": f1.mean(-1),
            "micro_f1": _ratio(2 * tp, predicted + n_all, 0.0),
        }
        for i, label in enumerate(labels):
            out[f"f1/{label}"] = np.where(absent[..., i], np.nan, f1[..., i])
            out[f"recall/{label}"] = np.where(absent[..., i], np.nan, recall[..., i])
            out[f"precision/{label}"] = precision[..., i]
        return out

    counted = {"accuracy": n, "macro_f1": n, "micro_f1": n}
    for i, label in enumerate(labels):
        counted[f"f1/{label}"] = counted[f"recall/{label}"] = int(gold_hot[:, i].sum())
        counted[f"precision/{label}"] = int(pred_hot[:, i].sum()) or int(gold_hot[:, i].sum())
    return Tally(counts, metrics, {"accuracy": (3 * c, None)}, correct.astype(float), list(gold), counted)


def format_tally(examples: Sequence[dict], metric_names: Sequence[str], groups: Sequence[str] | None) -> Tally:
    """From formats.format_report's `examples` and the names in its `metrics`."""
    cols = _Columns(len(examples))
    one = cols.add([1] * len(examples))
    valid = cols.add([e["valid"] for e in examples])
    rates = {"format_valid_rate": valid}
    for check in ("json_valid", "schema_valid", "regex_match"):
        if f"{check}_rate" in metric_names:
            rates[f"{check}_rate"] = cols.add([bool(e[check]) for e in examples])
    members = {}
    for group in sorted(set(groups or ())):
        member = [g == group for g in groups]
        members[group] = (cols.add(member), cols.add([m and e["valid"] for m, e in zip(member, examples, strict=True)]))
    counts = cols.matrix()

    def metrics(sums: np.ndarray, resampled: bool = False) -> dict[str, np.ndarray]:
        out = {name: _ratio(sums[..., col], sums[..., one]) for name, col in rates.items()}
        for group, (member, ok) in members.items():
            out[f"format_valid_rate/{group}"] = _ratio(sums[..., ok], sums[..., member])
        return out

    outcomes = {name: (col, None) for name, col in rates.items()}
    outcomes.update({f"format_valid_rate/{g}": (ok, member) for g, (member, ok) in members.items()})
    scores = counts[:, valid].astype(float)
    counted = {name: len(examples) for name in rates}
    counted.update({f"format_valid_rate/{g}": int(counts[:, member].sum()) for g, (member, _) in members.items()})
    return Tally(counts, metrics, outcomes, scores, list(groups) if groups else ["all"] * len(examples), counted)


def extraction_tally(
    examples: Sequence[dict], fields: Sequence[str], required: Sequence[str], groups: Sequence[str] | None
) -> Tally:
    """From formats.extraction_report's `examples`, `fields` and `required_fields`."""
    n, nf = len(examples), len(fields)
    cols = _Columns(n)
    one = cols.add([1] * n)
    binary = {
        "json_valid_rate": cols.add([e["json_valid"] for e in examples]),
        "required_present_rate": cols.add([e["required_present"] for e in examples]),
    }
    for f in required:
        binary[f"required_present_rate/{f}"] = cols.add([f not in e["missing"] for e in examples])
    exact = [cols.add([e["exact"][f] for e in examples]) for f in fields]
    normalized = [cols.add([e["normalized"][f] for e in examples]) for f in fields]
    for f, col in zip(fields, exact, strict=True):
        binary[f"field_accuracy/{f}"] = col
    for f, col in zip(fields, normalized, strict=True):
        binary[f"field_accuracy_normalized/{f}"] = col
    binary["extra_field_rate"] = cols.add([bool(e["extra"]) for e in examples])
    binary["type_error_rate"] = cols.add([bool(e["type_errors"]) for e in examples])
    right = np.array([sum(e["exact"][f] for f in fields) for e in examples], dtype=np.int64)
    members = {}
    for group in sorted(set(groups or ())):
        member = np.array([g == group for g in groups], dtype=np.int64)
        present = member * np.array([e["required_present"] for e in examples], dtype=np.int64)
        members[group] = (cols.add(member), cols.add(present), cols.add(member * right))
    counts = cols.matrix()

    def metrics(sums: np.ndarray, resampled: bool = False) -> dict[str, np.ndarray]:
        total = sums[..., one]
        out = {name: _ratio(sums[..., col], total) for name, col in binary.items()}
        out["field_accuracy"] = _ratio(sum(sums[..., c] for c in exact), total * nf)
        out["field_accuracy_normalized"] = _ratio(sum(sums[..., c] for c in normalized), total * nf)
        for group, (member, present, ok) in members.items():
            out[f"required_present_rate@{group}"] = _ratio(sums[..., present], sums[..., member])
            out[f"field_accuracy@{group}"] = _ratio(sums[..., ok], sums[..., member] * nf)
        return out

    outcomes = {name: (col, None) for name, col in binary.items()}
    outcomes.update({f"required_present_rate@{g}": (present, member) for g, (member, present, _) in members.items()})
    counted = {name: n for name in [*binary, "field_accuracy", "field_accuracy_normalized"]}
    for g, (member, _, _) in members.items():
        counted[f"required_present_rate@{g}"] = counted[f"field_accuracy@{g}"] = int(counts[:, member].sum())
    return Tally(counts, metrics, outcomes, right / nf, list(groups) if groups else ["all"] * n, counted)
