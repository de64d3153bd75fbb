"""Per-example tallies give every metric of the reports exactly; the vectorised paired bootstrap agrees with
scipy's; clusters are resampled whole; the same seed gives the same interval bit for bit; McNemar's exact p."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap

from entrypoint.evaluation.bootstrap import Bootstrap, compare, mcnemar_p, resample_sums
from entrypoint.evaluation.formats import extraction_report, format_report
from entrypoint.evaluation.metrics import classification_report
from entrypoint.evaluation.tally import classification_tally, extraction_tally, format_tally

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _same(tally, report: dict) -> None:
    values = tally.metrics(tally.counts.sum(0))
    assert set(values) == set(report["metrics"])
    for name, expected in report["metrics"].items():
        assert float(values[name]) == pytest.approx(expected, abs=1e-12), name


def test_classification_tally_gives_every_report_metric_including_an_unknown_prediction_and_an_empty_class():
    labels = ["a", "b", "c", "d"]  # d: no gold, never predicted (F1 0)
    gold = ["a", "a", "b", "b", "b", "c", "a", "c"]
    pred = ["a", "b", "b", "zzz", "b", "a", "a", "c"]  # zzz: outside the labels, wrong for every category
    _same(classification_tally(gold, pred, labels), classification_report(gold, pred, labels))


def test_format_tally_gives_every_report_metric_with_groups_and_regex():
    outputs = ['{"name": "x", "age": 3}', '{"name": "x"}', "nope", '{"name": "y", "age": 1}', "  {}  "]
    groups = ["g1", "g1", "g2", "g2", "g2"]
    report = format_report(outputs, json_schema=PERSON, groups=groups)
    _same(format_tally(report["examples"], list(report["metrics"]), groups), report)
    regex = format_report(["ABC-1234", "AB-1", " XYZ-0000 "], regex=r"[A-Z]{3}-\d{4}", expect_json=False)
    _same(format_tally(regex["examples"], list(regex["metrics"]), None), regex)


def test_extraction_tally_gives_every_report_metric_with_groups():
    outputs = ['{"name": "Ann", "age": 3}', '{"name": "ann."}', "[1]", '{"name": "Bo", "age": "4", "x": 1}']
    golds = [{"name": "Ann", "age": 3}, {"name": "Ann", "age": 5}, {"name": "C", "age": 1}, {"name": "Bo", "age": 4}]
    report = extraction_report(outputs, golds, required_fields=["name", "age"], groups=["en", "en", "fr", "fr"])
    tally = extraction_tally(report["examples"], report["fields"], report["required_fields"], ["en", "en", "fr", "fr"])
    _same(tally, report)
    assert tally.scores.tolist() == [1.0, 0.0, 0.0, 0.5]  # share of fields exactly right, per example


def _macro_f1(gold: np.ndarray, pred: np.ndarray, classes: int) -> np.ndarray:
    """Macro-F1 along the last axis, for scipy's vectorised statistic."""
    f1 = []
    for c in range(classes):
        tp = np.sum((gold == c) & (pred == c), axis=-1)
        total = np.sum(gold == c, axis=-1) + np.sum(pred == c, axis=-1)
        f1.append(np.where(total > 0, 2 * tp / np.maximum(total, 1), 0.0))
    return np.mean(f1, axis=0)


def test_the_vectorised_paired_bootstrap_agrees_with_scipy_for_macro_f1_and_a_mean():
    rng = np.random.default_rng(7)
    n, classes = 300, 4
    gold = rng.integers(0, classes, n)
    base = np.where(rng.random(n) < 0.6, gold, rng.integers(0, classes, n))
    trial = np.where(rng.random(n) < 0.75, gold, rng.integers(0, classes, n))
    labels = [str(c) for c in range(classes)]

    def names(a):
        return [labels[i] for i in a]

    b = classification_tally(names(gold), names(base), labels)
    t = classification_tally(names(gold), names(trial), labels)
    ours = compare(b, t, ["macro_f1", "accuracy"], Bootstrap(resamples=10_000, seed=1))
    draws = resample_sums(np.concatenate([b.counts, t.counts], axis=1), None, 10_000, 1)
    m = b.counts.shape[1]
    sd = {
        name: float(np.std(t.metrics(draws[:, m:])[name] - b.metrics(draws[:, :m])[name]))
        for name in ("macro_f1", "accuracy")
    }

    def f1_gain(g, p0, p1, axis=-1):
        return _macro_f1(g, p1, classes) - _macro_f1(g, p0, classes)

    def accuracy_gain(g, p0, p1, axis=-1):
        return np.mean(p1 == g, axis=axis) - np.mean(p0 == g, axis=axis)

    for name, statistic in (("macro_f1", f1_gain), ("accuracy", accuracy_gain)):
        theirs = bootstrap(
            (gold, base, trial),
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=10_000,
            method="percentile",
            confidence_level=0.95,
            random_state=np.random.default_rng(2),
        ).confidence_interval
        # Monte-Carlo error: each endpoint of a 10,000-resample percentile interval has a standard error of
        # about 0.03 sd of the draws, their difference between two independent runs about 0.04 sd. Allowed:
        # 0.2 sd (5 standard errors), here about 0.008 for macro-F1.
        tolerance = 0.2 * sd[name]
        assert ours[name]["interval"][0] == pytest.approx(theirs.low, abs=tolerance), name
        assert ours[name]["interval"][1] == pytest.approx(theirs.high, abs=tolerance), name


def test_clusters_are_resampled_whole_and_widen_the_interval_of_correlated_rows():
    rng = np.random.default_rng(5)
    docs = 60
    # every document's 5 rows share one outcome: 300 rows, but only 60 independent ones
    base_doc, trial_doc = rng.random(docs) < 0.5, rng.random(docs) < 0.7
    base = ["a" if x else "b" for x in np.repeat(base_doc, 5)]
    trial = ["a" if x else "b" for x in np.repeat(trial_doc, 5)]
    clusters = [f"doc-{i}" for i in np.repeat(np.arange(docs), 5)]
    gold = ["a"] * len(base)
    b, t = classification_tally(gold, base, ["a", "b"]), classification_tally(gold, trial, ["a", "b"])
    settings = Bootstrap(resamples=4000, seed=3)
    rows = compare(b, t, ["accuracy"], settings)["accuracy"]["interval"]
    whole = compare(b, t, ["accuracy"], settings, clusters=clusters)["accuracy"]["interval"]
    ratio = (whole[1] - whole[0]) / (rows[1] - rows[0])
    assert 1.8 < ratio < 2.7  # sqrt(5) = 2.24: the cluster interval is as wide as 60 examples allow
    # a resample of clusters draws 60 clusters of 5 rows: every resample sums to 300 rows
    sums = resample_sums(b.counts, clusters, 50, 0)
    assert np.all(sums[:, :2].sum(1) == 300)


def test_the_same_seed_gives_the_same_interval_bit_for_bit_and_another_seed_does_not():
    rng = np.random.default_rng(0)
    gold = list(rng.choice(["x", "y", "z"], 500))
    b = classification_tally(gold, list(rng.choice(["x", "y", "z"], 500)), ["x", "y", "z"])
    t = classification_tally(gold, gold[:400] + list(rng.choice(["x", "y", "z"], 100)), ["x", "y", "z"])
    first = compare(b, t, ["macro_f1", "f1/x"], Bootstrap(resamples=3000, seed=9))
    again = compare(b, t, ["macro_f1", "f1/x"], Bootstrap(resamples=3000, seed=9))
    other = compare(b, t, ["macro_f1", "f1/x"], Bootstrap(resamples=3000, seed=10))
    assert first == again
    assert first["macro_f1"]["interval"] != other["macro_f1"]["interval"]


def test_mcnemar_counts_discordant_pairs_and_gives_the_exact_binomial_p():
    first = np.array([1] * 10 + [0] * 3 + [1] * 20 + [0] * 5)
    second = np.array([0] * 10 + [1] * 3 + [1] * 20 + [0] * 5)
    only_first, only_second, p = mcnemar_p(first, second)
    assert (only_first, only_second) == (10, 3)
    assert p == pytest.approx(binomtest(3, 13, 0.5).pvalue) and p == pytest.approx(0.0923, abs=1e-4)
    assert mcnemar_p(first, first)[2] == 1.0
    gold = ["a"] * len(first)
    b = classification_tally(gold, ["a" if x else "b" for x in first], ["a", "b"])
    t = classification_tally(gold, ["a" if x else "b" for x in second], ["a", "b"])
    entry = compare(b, t, ["accuracy", "macro_f1"], Bootstrap(resamples=1000))
    assert entry["accuracy"]["mcnemar"] == {"only_before": 10, "only_after": 3, "p": p}
    assert "mcnemar" not in entry["macro_f1"]  # not a rate of binary outcomes


def test_too_few_clusters_give_no_interval_and_no_mcnemar():
    rng = np.random.default_rng(2)
    base = ["a" if x else "b" for x in rng.random(200) < 0.5]
    trial = ["a" if x else "b" for x in rng.random(200) < 0.7]
    gold = ["a"] * 200
    b, t = classification_tally(gold, base, ["a", "b"]), classification_tally(gold, trial, ["a", "b"])
    for clusters in (["one"] * 200, [f"c{i % 3}" for i in range(200)]):
        entry = compare(b, t, ["accuracy"], Bootstrap(resamples=1000), clusters=clusters)["accuracy"]
        assert all(np.isnan(entry["interval"])) and "mcnemar" not in entry  # read as inconclusive
    many = compare(b, t, ["accuracy"], Bootstrap(resamples=1000), clusters=[f"c{i % 40}" for i in range(200)])
    assert not any(np.isnan(many["accuracy"]["interval"])) and "mcnemar" not in many["accuracy"]


def test_a_small_category_broken_entirely_fails_instead_of_drawing_zeros_from_resamples_that_miss_it():
    labels = ["big", "small"]
    gold = ["big"] * 197 + ["small"] * 3
    before = list(gold)  # the baseline gets everything right
    after = ["big"] * 200  # the trial breaks all 3 small examples
    b, t = classification_tally(gold, before, labels), classification_tally(gold, after, labels)
    entry = compare(b, t, ["f1/small", "recall/small"], Bootstrap(resamples=4000, seed=0))
    # resamples without a small example say nothing of it: left out, not counted as "no change"
    assert entry["f1/small"]["interval"] == [-1.0, -1.0] and entry["recall/small"]["interval"] == [-1.0, -1.0]
