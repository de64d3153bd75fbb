"""Classification metrics, per category first: a global average can hide a category that got worse.

Pure Python on label strings so that baseline, trained model and verification all share one definition.
`METRICS_VERSION` is recorded in every eval config; bump it when a definition changes.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["METRICS_VERSION", "classification_report"]

METRICS_VERSION = "classification-2"  # 2: flat `metrics` for guardrails


def _f1(precision: float, recall: float) -> float:
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def classification_report(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> dict:
    """Per-category precision/recall/F1/support, macro and micro averages, accuracy, confusion matrix, and
    `metrics`: the same numbers flat (`macro_f1`, `f1/<category>`, ...), as guardrails name them.

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
    headline = {
        "accuracy": sum(1 for g, p in zip(gold, pred, strict=True) if g == p) / len(gold),
        "macro_f1": sum(c["f1"] for c in per_category.values()) / len(labels),
        "micro_f1": _f1(micro_p, micro_r),
    }
    flat = dict(headline)
    for label, scores in per_category.items():
        for name in ("f1", "precision", "recall"):
            flat[f"{name}/{label}"] = scores[name]
    return {
        "metrics_version": METRICS_VERSION,
        "n": len(gold),
        **headline,
        "metrics": flat,
        "per_category": per_category,
        "confusion": {"labels": list(labels), "rows_gold_cols_pred": confusion},
    }
