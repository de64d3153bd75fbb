"""The classification task: each example's output is one of the labels. Metrics: accuracy, macro F1 and
per-category precision, recall and F1 (evaluation/metrics.py)."""

from __future__ import annotations

from collections.abc import Sequence

from entrypoint.evaluation.metrics import METRICS_VERSION, classification_report
from entrypoint.evaluation.tally import Tally, classification_tally
from jobspec.schema import JobSpec

__all__ = ["Classification"]


class Classification:
    name = "classification"
    loss = "example"  # one label per sequence
    breakdown = "f1"  # per category

    def __init__(self, spec: JobSpec):
        self.spec = spec

    def score(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> dict:
        return classification_report([r["label"] for r in rows], outputs, labels)

    def tally(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> Tally:
        return classification_tally([r["label"] for r in rows], outputs, labels)

    def settings(self) -> dict:
        return {"metrics_version": METRICS_VERSION}

    def notes(self) -> list[str]:
        return []
