"""The extraction task: each generated response is a JSON object whose fields are compared with the
reference response's. Metrics: field accuracy, overall and per field, required fields present, exact
match (evaluation/formats.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from entrypoint.evaluation.formats import FORMATS_VERSION, extraction_report
from entrypoint.evaluation.tally import Tally, extraction_tally
from entrypoint.kinds.format import groups_of
from jobspec.schema import JobSpec

__all__ = ["Extraction"]


class Extraction:
    name = "extraction"
    loss = "token"  # every response token counts once across the accumulated batch
    breakdown = "field_accuracy"  # per field

    def __init__(self, spec: JobSpec):
        self.spec = spec

    def score(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> dict:
        return extraction_report(
            outputs,
            [json.loads(r["response"]) for r in rows],
            required_fields=self.spec.hypothesis.required_fields,
            fields=self.spec.hypothesis.fields,
            groups=groups_of(rows, labels),
        )

    def tally(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> Tally:
        report = self.score(rows, outputs, labels)
        return extraction_tally(
            report["examples"], report["fields"], report["required_fields"], groups_of(rows, labels)
        )

    def settings(self) -> dict:
        h = self.spec.hypothesis
        return {"metrics_version": FORMATS_VERSION, "required_fields": h.required_fields, "fields": h.fields}

    def notes(self) -> list[str]:
        return ["Generated outputs are scored with strict JSON parsing: text around the JSON counts as invalid."]
