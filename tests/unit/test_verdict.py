"""The three-valued verdicts on paired intervals: per-category guardrails, lower-is-better metrics, min_gain
0, and the rules' error rates on simulated eval sets with a known true change."""

from __future__ import annotations

import numpy as np
import pytest

from entrypoint.evaluation.bootstrap import Bootstrap, compare
from entrypoint.evaluation.judge import power, power_lines
from entrypoint.evaluation.metrics import classification_report
from entrypoint.evaluation.tally import classification_tally
from entrypoint.evaluation.verdict import GuardrailError, check_guardrails, expand, hypothesis_verdict, overall
from jobspec.schema import Guardrail, Hypothesis
from tests.specs import load, tiny_job

LABELS = ["billing", "shipping", "returns"]
GOLD = ["billing"] * 40 + ["shipping"] * 40 + ["returns"] * 40


def _pred(misses: dict[str, tuple[int, str]]) -> list[str]:
    """Predictions for GOLD where category c gets misses[c] = (how many wrong, predicted as what)."""
    pred = []
    for label in LABELS:
        wrong, other = misses.get(label, (0, label))
        pred += [label] * (40 - wrong) + [other] * wrong
    return pred


def _comparison(before: list[str], after: list[str], resamples: int = 4000) -> dict:
    b, a = classification_tally(GOLD, before, LABELS), classification_tally(GOLD, after, LABELS)
    names = list(b.metrics(b.counts.sum(0)))
    return compare(b, a, names, Bootstrap(resamples=resamples, seed=1))


def _c(low: float, high: float, change: float = 0.0) -> dict:
    return {"before": 0.5, "after": 0.5 + change, "change": change, "interval": [low, high]}


def test_a_clear_regression_in_one_category_fails_its_guardrail_while_the_macro_average_improves():
    # baseline: billing perfect, shipping and returns confused half the time; trial: those two fixed,
    # but 24 of 40 billing messages now go to shipping
    before = _pred({"shipping": (20, "returns"), "returns": (20, "shipping")})
    after = _pred({"billing": (24, "shipping")})
    comparison = _comparison(before, after)
    assert comparison["macro_f1"]["change"] > 0.05  # the average says "better"
    checks = check_guardrails([Guardrail(metric="f1/*", tolerance=0.02)], comparison)
    assert [c["metric"] for c in checks] == ["f1/billing", "f1/returns", "f1/shipping"]
    result = {c["metric"]: c["result"] for c in checks}
    assert result == {"f1/billing": "fail", "f1/returns": "pass", "f1/shipping": "pass"}
    assert overall(checks) == "fail"
    billing = next(c for c in checks if c["metric"] == "f1/billing")
    assert billing["interval"][1] < -0.02 and billing["baseline"] == 1.0
    macro = check_guardrails([Guardrail(metric="macro_f1")], comparison)
    assert macro[0]["result"] == "pass"  # a macro-only guardrail would have missed it


def test_a_small_regression_on_few_examples_is_inconclusive_not_a_fail():
    before = _pred({})
    after = _pred({"billing": (2, "shipping")})  # 2 of 40: within sampling noise of a 0.02 tolerance
    checks = check_guardrails([Guardrail(metric="f1/billing", tolerance=0.02)], _comparison(before, after))
    assert checks[0]["change"] < -0.02 and checks[0]["result"] == "inconclusive"
    assert checks[0]["interval"][0] < -0.02 < checks[0]["interval"][1]


def test_guardrail_rules_on_the_interval_and_lower_is_better_metrics_flip():
    comparison = {
        "f1/a": _c(-0.04, 0.10),  # lower bound -0.04 >= -0.05: pass
        "f1/b": _c(-0.20, -0.06),  # upper bound below -0.05: fail
        "f1/c": _c(-0.08, 0.02),  # straddles -0.05: inconclusive
        "extra_field_rate": _c(-0.10, 0.04),  # lower is better: worse is +; [-0.04, 0.10] signed: pass
        "type_error_rate": _c(0.06, 0.20),  # rose by at least 0.06: fail
    }
    checks = check_guardrails(
        [Guardrail(metric="f1/*", tolerance=0.05), Guardrail(metric="extra_field_rate", tolerance=0.05)]
        + [Guardrail(metric="type_error_rate", tolerance=0.05)],
        comparison,
    )
    assert [c["result"] for c in checks] == ["pass", "fail", "inconclusive", "pass", "fail"]
    assert overall(checks[:1]) == "pass" and overall([checks[0], checks[2]]) == "inconclusive" and overall([]) == "pass"
    exact = check_guardrails([Guardrail(metric="f1/a", tolerance=0.04)], comparison)
    assert exact[0]["result"] == "pass"  # the tolerance is inclusive


def test_hypothesis_rules_and_min_gain_zero():
    h = Hypothesis(task="classification", statement="s", min_gain=0.1)
    assert hypothesis_verdict(h, {"macro_f1": _c(0.10, 0.3, 0.2)})["result"] == "holds"
    assert hypothesis_verdict(h, {"macro_f1": _c(0.05, 0.3, 0.2)})["result"] == "inconclusive"
    assert hypothesis_verdict(h, {"macro_f1": _c(-0.1, 0.09, 0.0)})["result"] == "does not hold"
    h0 = Hypothesis(task="classification", statement="s")
    assert hypothesis_verdict(h0, {"macro_f1": _c(0.0, 0.0)})["result"] == "does not hold"  # no change at all
    assert hypothesis_verdict(h0, {"macro_f1": _c(0.01, 0.2, 0.1)})["result"] == "holds"
    assert hypothesis_verdict(h0, {"macro_f1": _c(-0.01, 0.2, 0.1)})["result"] == "inconclusive"


def test_a_guardrail_on_a_metric_never_computed_is_an_error():
    with pytest.raises(GuardrailError, match="no such metric is computed for this job"):
        expand("f1/*", {"macro_f1": 0.5})
    with pytest.raises(ValueError, match="schema_valid_rate"):
        check_guardrails([Guardrail(metric="schema_valid_rate")], {"format_valid_rate": _c(0, 0)})


# -- known-answer simulations: the rules keep the error rate they promise ---------------------------------
N, SETS, RESAMPLES = 300, 400, 1000


def _simulate(rng, p_base_only: float, p_trial_only: float, p_both: float) -> tuple[list[str], list[str]]:
    """One paired eval set of N binary outcomes: (baseline right, trial right) drawn from the four cells;
    gold is always `a`, a wrong answer is `b`. The true change of accuracy is p_trial_only - p_base_only."""
    cells = rng.choice(4, size=N, p=[p_both, p_base_only, p_trial_only, 1 - p_both - p_base_only - p_trial_only])
    base = ["a" if c in (0, 1) else "b" for c in cells]
    trial = ["a" if c in (0, 2) else "b" for c in cells]
    return base, trial


def _verdicts(true_gain: float, min_gain: float, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    h = Hypothesis(task="classification", statement="s", metric="accuracy", min_gain=min_gain)
    out = []
    for i in range(SETS):
        base, trial = _simulate(rng, 0.10, 0.10 + true_gain, 0.50)
        gold = ["a"] * N
        b, t = classification_tally(gold, base, ["a", "b"]), classification_tally(gold, trial, ["a", "b"])
        comparison = compare(b, t, ["accuracy"], Bootstrap(resamples=RESAMPLES, seed=i))
        out.append(hypothesis_verdict(h, comparison)["result"])
    return out


def test_a_true_gain_equal_to_min_gain_holds_in_at_most_5_percent_of_400_eval_sets():
    verdicts = _verdicts(true_gain=0.05, min_gain=0.05, seed=11)
    assert verdicts.count("holds") <= 0.05 * SETS, verdicts.count("holds")
    assert verdicts.count("inconclusive") > 0.5 * SETS  # at the boundary, honesty is "inconclusive"


def test_a_true_gain_of_min_gain_plus_twice_the_detectable_change_holds_in_at_least_80_percent():
    rng = np.random.default_rng(3)
    base, _ = _simulate(rng, 0.10, 0.10, 0.50)
    spec = load(
        tiny_job(
            "power",
            "/nonexistent",
            hypothesis={"task": "classification", "statement": "s", "metric": "accuracy", "min_gain": 0.05},
            evaluation={"resamples": RESAMPLES},
        )
    ).spec
    rows = [{"text": str(i), "label": "a"} for i in range(N)]
    table = power(spec, classification_tally(["a"] * N, base, ["a", "b"]), rows, n_test=N)
    detectable = table["metrics"][0]["eval"]["detectable"]
    assert 0.05 < detectable < 0.15  # 300 binary outcomes: about +/-0.07 at 95%
    verdicts = _verdicts(true_gain=0.05 + 2 * detectable, min_gain=0.05, seed=12)
    assert verdicts.count("holds") >= 0.8 * SETS, verdicts.count("holds")


def test_a_baseline_that_never_varies_still_gets_a_detectable_change_from_the_split_size():
    spec = load(
        tiny_job("flat", "/nonexistent", hypothesis={"task": "classification", "statement": "s", "min_gain": 0.1})
    ).spec
    rows = [{"text": str(i), "label": "a"} for i in range(100)]
    table = power(spec, classification_tally(["a"] * 100, ["b"] * 100, ["a", "b"]), rows, n_test=25)
    macro = table["metrics"][0]
    assert macro["eval"]["detectable"] == pytest.approx(1.959964 * 0.5 / 10)  # z x sqrt(0.25 / 100)
    assert macro["test"]["detectable"] == pytest.approx(2 * macro["eval"]["detectable"])  # a quarter the examples
    assert macro["decidable"] is False  # 0.098 on eval would do for min_gain 0.1; 0.196 on test would not
    assert macro["needed"] == {"eval": 100, "test": 97}  # 25 x (0.196 / 0.1)^2


def test_a_guardrail_whose_true_change_is_exactly_minus_tolerance_passes_in_at_most_5_percent():
    rng, tolerance, passes = np.random.default_rng(13), 0.05, 0
    gold = ["a"] * N
    for i in range(SETS):
        base, trial = _simulate(rng, 0.10 + tolerance, 0.10, 0.50)  # the trial loses `tolerance` accuracy
        b, t = classification_tally(gold, base, ["a", "b"]), classification_tally(gold, trial, ["a", "b"])
        comparison = compare(b, t, ["accuracy"], Bootstrap(resamples=RESAMPLES, seed=i))
        passes += (
            check_guardrails([Guardrail(metric="accuracy", tolerance=tolerance)], comparison)[0]["result"] == "pass"
        )
    assert passes <= 0.05 * SETS, passes


def test_the_report_values_and_the_comparison_agree():
    before = _pred({"shipping": (20, "returns")})
    after = _pred({"billing": (3, "returns")})
    comparison = _comparison(before, after, resamples=1000)
    report = classification_report(GOLD, after, LABELS)["metrics"]
    assert set(comparison) == set(report)
    for name, value in report.items():
        assert comparison[name]["after"] == pytest.approx(value, abs=1e-12), name


def test_a_min_gain_above_what_the_baseline_leaves_below_1_cannot_hold_and_the_table_says_so():
    rows = [{"text": str(i), "label": "a"} for i in range(100)]
    for correct, min_gain, reachable in ((97, 0.05, False), (97, 0.03, True), (50, 0.05, True)):
        spec = load(
            tiny_job(
                "ceiling",
                "/nonexistent",
                hypothesis={"task": "classification", "statement": "s", "metric": "accuracy", "min_gain": min_gain},
            )
        ).spec
        predicted = ["a"] * correct + ["b"] * (100 - correct)
        table = power(spec, classification_tally(["a"] * 100, predicted, ["a", "b"]), rows, n_test=100)
        hypothesis = table["metrics"][0]
        assert hypothesis["room"] == pytest.approx(1 - correct / 100) and hypothesis["reachable"] is reachable
        shown = power_lines(table)[1]
        assert ("NO (cannot hold: the baseline leaves 0.030)" in shown) is (not reachable), shown
