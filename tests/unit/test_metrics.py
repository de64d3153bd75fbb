from __future__ import annotations

import pytest

from entrypoint.evaluation.metrics import classification_report


def test_per_category_numbers_by_hand():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    report = classification_report(gold, pred, ["a", "b", "c"])
    a, b, c = (report["per_category"][k] for k in "abc")
    assert (a["precision"], a["recall"]) == (1.0, pytest.approx(2 / 3))
    assert (b["precision"], b["recall"], b["f1"]) == (0.5, 0.5, 0.5)
    assert (c["precision"], c["recall"]) == (0.5, 1.0)
    assert report["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert report["accuracy"] == pytest.approx(4 / 6)
    assert report["micro_f1"] == pytest.approx(4 / 6)
    assert report["confusion"]["rows_gold_cols_pred"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]


def test_category_never_predicted_scores_zero_and_is_listed():
    report = classification_report(["a", "b"], ["a", "a"], ["a", "b"])
    assert report["per_category"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        classification_report(["a"], [], ["a"])


def test_flat_metrics_name_every_category():
    report = classification_report(["a", "b", "b"], ["a", "b", "a"], ["a", "b"])
    assert report["metrics"] == {
        "accuracy": 2 / 3,
        "macro_f1": report["macro_f1"],
        "micro_f1": report["micro_f1"],
        "f1/a": 2 * 0.5 * 1.0 / 1.5,
        "precision/a": 0.5,
        "recall/a": 1.0,
        "f1/b": 2 * 1.0 * 0.5 / 1.5,
        "precision/b": 1.0,
        "recall/b": 0.5,
    }
