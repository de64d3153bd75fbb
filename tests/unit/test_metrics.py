from __future__ import annotations

import pytest

from entrypoint.metrics import classification_report, format_side_by_side


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


def test_side_by_side_shows_change():
    before = classification_report(["a", "b"], ["a", "a"], ["a", "b"])
    after = classification_report(["a", "b"], ["a", "b"], ["a", "b"])
    table = format_side_by_side(before, after, ["a", "b"])
    assert "b" in table and "+1.000" in table and "macro_f1" in table
