"""Guardrails per category against the baseline, and the hypothesis verdict, on real metric reports."""

from __future__ import annotations

import pytest

from entrypoint.evaluation.metrics import classification_report
from entrypoint.evaluation.verdict import GuardrailError, check_guardrails, expand, hypothesis_verdict
from jobspec.schema import Guardrail, Hypothesis

LABELS = ["billing", "shipping", "returns"]
GOLD = ["billing"] * 10 + ["shipping"] * 10 + ["returns"] * 10


def _pred(misses: dict[str, tuple[int, str]]) -> list[str]:
    """Predictions for GOLD where category c gets misses[c] = (how many wrong, predicted as what)."""
    pred = []
    for label in LABELS:
        wrong, other = misses.get(label, (0, label))
        pred += [label] * (10 - wrong) + [other] * wrong
    return pred


def test_a_regression_in_one_category_fails_its_guardrail_while_the_macro_average_improves():
    # baseline: billing perfect (F1 1.0), shipping and returns confused with each other (F1 0.5 each)
    baseline = classification_report(GOLD, _pred({"shipping": (5, "returns"), "returns": (5, "shipping")}), LABELS)
    # trial: shipping and returns fixed (0.909, 1.0), but 2 billing messages now go to shipping (F1 0.889)
    trial = classification_report(GOLD, _pred({"billing": (2, "shipping")}), LABELS)
    baseline, trial = baseline["metrics"], trial["metrics"]
    assert trial["f1/billing"] == pytest.approx(2 * 0.8 / 1.8) and baseline["f1/billing"] == 1.0
    assert trial["macro_f1"] > baseline["macro_f1"] + 0.1  # the average says "better"
    checks = check_guardrails([Guardrail(metric="f1/*", tolerance=0.02)], baseline, trial)
    assert [c["metric"] for c in checks] == ["f1/billing", "f1/returns", "f1/shipping"]
    failed = {c["metric"]: c for c in checks if not c["passed"]}
    assert list(failed) == ["f1/billing"]
    assert failed["f1/billing"]["change"] < -0.02
    macro = check_guardrails([Guardrail(metric="macro_f1")], baseline, trial)
    assert macro[0]["passed"]  # a macro-only guardrail would have missed it
    verdict = hypothesis_verdict(Hypothesis(task="classification", statement="s", min_gain=0.05), baseline, trial)
    assert verdict["holds"] and verdict["gain"] == pytest.approx(trial["macro_f1"] - baseline["macro_f1"])


def test_tolerance_is_inclusive_and_lower_is_better_metrics_flip():
    baseline = {"f1/a": 0.80, "extra_field_rate": 0.10, "field_accuracy/name": 0.5}
    trial = {"f1/a": 0.75, "extra_field_rate": 0.16, "field_accuracy/name": 0.9}
    checks = check_guardrails(
        [
            Guardrail(metric="f1/a", tolerance=0.05),
            Guardrail(metric="extra_field_rate", tolerance=0.05),
            Guardrail(metric="field_accuracy/*"),
        ],
        baseline,
        trial,
    )
    assert [c["passed"] for c in checks] == [True, False, True]


def test_min_gain_and_no_gain():
    h = Hypothesis(task="classification", statement="s", min_gain=0.1)
    assert not hypothesis_verdict(h, {"macro_f1": 0.5}, {"macro_f1": 0.59})["holds"]
    assert hypothesis_verdict(h, {"macro_f1": 0.5}, {"macro_f1": 0.61})["holds"]
    h0 = Hypothesis(task="classification", statement="s")
    assert not hypothesis_verdict(h0, {"macro_f1": 0.5}, {"macro_f1": 0.5})["holds"]


def test_a_guardrail_on_a_metric_never_computed_is_an_error():
    with pytest.raises(GuardrailError, match="no such metric is computed for this job"):
        expand("f1/*", {"macro_f1": 0.5})
    with pytest.raises(ValueError, match="schema_valid_rate"):
        check_guardrails([Guardrail(metric="schema_valid_rate")], {"format_valid_rate": 1.0}, {})
