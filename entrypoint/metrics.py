"""Classification metrics, per category first: a global average can hide a category that got worse.

Pure Python on label strings so that baseline, trained model and verification all share one definition.
`METRICS_VERSION` is recorded in every eval config; bump it when a definition changes.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["METRICS_VERSION", "classification_report", "format_side_by_side"]

METRICS_VERSION = "classification-1"


def _f1(precision: float, recall: float) -> float:
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def classification_report(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> dict:
    """Per-category precision/recall/F1/support, macro and micro averages, accuracy, confusion matrix.

    `labels` fixes the category order; a predicted label outside it counts as wrong for every category.
    A category with no gold and no predicted examples gets F1 0 (and is visible in `per_category`).
    Raises ValueError if `gold` and `pred` differ in length or are empty.
    """
    if len(gold) != len(pred) or not gold:
        raise ValueError(f"expected equal, non-zero lengths, got gold={len(gold)} pred={len(pred)}")
    index = {label: i for i, label in enumerate(labels)}
    confusion = [[0] * len(labels) for _ in labels]
    for g, p in zip(gold, pred, strict=True):
        if g in index and p in index:
            confusion[index[g]][index[p]] += 1
    per_category = {}
    total_tp = total_fp = total_fn = 0
    for label in labels:
        tp = sum(1 for g, p in zip(gold, pred, strict=True) if g == label and p == label)
        fp = sum(1 for g, p in zip(gold, pred, strict=True) if g != label and p == label)
        fn = sum(1 for g, p in zip(gold, pred, strict=True) if g == label and p != label)
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        per_category[label] = {
            "precision": precision,
            "recall": recall,
            "f1": _f1(precision, recall),
            "support": tp + fn,
        }
        total_tp, total_fp, total_fn = total_tp + tp, total_fp + fp, total_fn + fn
    micro_p = total_tp / (total_tp + total_fp) if total_tp + total_fp else 0.0
    micro_r = total_tp / (total_tp + total_fn) if total_tp + total_fn else 0.0
    return {
        "metrics_version": METRICS_VERSION,
        "n": len(gold),
        "accuracy": sum(1 for g, p in zip(gold, pred, strict=True) if g == p) / len(gold),
        "macro_f1": sum(c["f1"] for c in per_category.values()) / len(labels),
        "micro_f1": _f1(micro_p, micro_r),
        "per_category": per_category,
        "confusion": {"labels": list(labels), "rows_gold_cols_pred": confusion},
    }


def format_side_by_side(baseline: dict, adapted: dict, labels: Sequence[str]) -> str:
    """A plain-text table of per-category F1, baseline vs adapted, with the change."""
    width = max(len("macro_f1"), *(len(label) for label in labels))
    lines = [f"{'category':<{width}}  {'baseline':>8}  {'adapted':>8}  {'change':>7}"]
    rows = [(label, baseline["per_category"][label]["f1"], adapted["per_category"][label]["f1"]) for label in labels]
    rows.append(("macro_f1", baseline["macro_f1"], adapted["macro_f1"]))
    for name, before, after in rows:
        if name == "macro_f1":
            lines.append("-" * len(lines[0]))
        lines.append(f"{name:<{width}}  {before:>8.3f}  {after:>8.3f}  {after - before:>+7.3f}")
    return "\n".join(lines)
