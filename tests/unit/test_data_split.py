from __future__ import annotations

import random

import pytest

from entrypoint.data.reading import DataError
from entrypoint.data.split import data_version, split_rows

ROWS = [{"text": f"message number {i} about {label}", "label": label} for label in "abc" for i in range(20)]


def test_split_is_stratified_and_disjoint():
    splits = split_rows(ROWS, 0.2, 0.2, seed=1)
    for label in "abc":
        assert [sum(r["label"] == label for r in splits[s]) for s in ("train", "eval", "test")] == [12, 4, 4]
    texts = [r["text"] for part in splits.values() for r in part]
    assert sorted(texts) == sorted(r["text"] for r in ROWS)


RECIPE = {"rules": ["normalize_ws@1"], "tokenizer_sha256": "t" * 64}


def test_version_ignores_input_order_and_changes_with_content_seed_or_recipe():
    shuffled = ROWS[:]
    random.Random(5).shuffle(shuffled)
    base = data_version(split_rows(ROWS, 0.2, 0.2, 1), RECIPE)
    assert data_version(split_rows(shuffled, 0.2, 0.2, 1), RECIPE) == base
    edited = [dict(r) for r in ROWS]
    edited[7]["text"] += "!"
    assert data_version(split_rows(edited, 0.2, 0.2, 1), RECIPE) != base
    assert data_version(split_rows(ROWS, 0.2, 0.2, 2), RECIPE) != base
    assert data_version(split_rows(ROWS, 0.2, 0.2, 1), {**RECIPE, "rules": ["normalize_ws@2"]}) != base


def test_tiny_category_is_refused():
    with pytest.raises(DataError, match="category 'z' has 2 examples"):
        split_rows(ROWS + [{"text": "x", "label": "z"}, {"text": "y", "label": "z"}], 0.2, 0.2, 1)
