"""The format task: each generated response must follow `hypothesis.format` (valid JSON, a JSON Schema, a
regex). Metrics: the valid rate, overall and per group (evaluation/formats.py)."""

from __future__ import annotations

from collections.abc import Sequence

from entrypoint.evaluation.formats import FORMATS_VERSION, format_report
from entrypoint.evaluation.tally import Tally, format_tally
from jobspec.schema import JobSpec

__all__ = ["Format", "groups_of"]


def groups_of(rows: Sequence[dict], labels: Sequence[str]) -> list[str] | None:
    """Each row's group (its label) for per-group metrics, or None when every row is in one group."""
    return [r["label"] for r in rows] if len(set(labels)) > 1 else None


class Format:
    name = "format"
    loss = "token"  # every response token counts once across the accumulated batch
    breakdown = "format_valid_rate"  # per group

    def __init__(self, spec: JobSpec):
        self.spec = spec

    def score(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> dict:
        rule = self.spec.hypothesis.format
        return format_report(
            outputs,
            json_schema=rule.json_schema,
            regex=rule.regex,
            expect_json=rule.expect_json,
            groups=groups_of(rows, labels),
        )

    def tally(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> Tally:
        report = self.score(rows, outputs, labels)
        return format_tally(report["examples"], list(report["metrics"]), groups_of(rows, labels))

    def settings(self) -> dict:
        return {"metrics_version": FORMATS_VERSION}

    def notes(self) -> list[str]:
        return ["Generated outputs are scored with strict JSON parsing: text around the JSON counts as invalid."]
