"""Rows spooled to disk (data/spool.py) give exactly what rows held in lists gave: the same split, the same
de-duplication (first row kept, a contradicting label refused at the first such row), the same data version
as the formula that joined every row hash as text."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from entrypoint.data.reading import DataError
from entrypoint.data.split import data_version, split_rows
from entrypoint.data.spool import Mapped, Spool, drop_rows, labels_of
from entrypoint.data.text import dedupe, dedupe_key

ROWS = [{"text": f"message {i} about {label} – é", "label": label} for label in "abc" for i in range(40)]


def _spooled(tmp_path, rows, key_fields=("text",)):
    spool = Spool(tmp_path / "rows.jsonl")
    for row in rows:
        spool.add(row, dedupe_key(row, key_fields))
    return spool, spool.close()


def _version_as_before(splits: dict, recipe: dict) -> str:
    """The data version's definition, written the way it was first computed (every row hash as hex text)."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for name in sorted(splits):
        row_hashes = sorted(hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest() for r in splits[name])
        digest.update(f"\n{name}:{','.join(row_hashes)}".encode())
    return digest.hexdigest()


def test_spooled_rows_read_back_in_order_with_their_fields_and_labels(tmp_path):
    spool, rows = _spooled(tmp_path, ROWS)
    assert len(rows) == len(ROWS) and list(rows) == ROWS and rows[7] == ROWS[7] and rows[-1] == ROWS[-1]
    assert list(rows[0]) == ["text", "label"]  # field order as read
    assert rows[3:6] == ROWS[3:6] and isinstance(rows[3:6], list)
    assert labels_of(rows) == [r["label"] for r in ROWS]
    picked = rows.take([5, 2, 9])
    assert list(picked) == [ROWS[5], ROWS[2], ROWS[9]] and labels_of(picked) == [ROWS[i]["label"] for i in (5, 2, 9)]
    assert list(drop_rows(picked, {1})) == [ROWS[5], ROWS[9]]
    assert list(Mapped(picked, lambda r: r["text"].upper())) == [ROWS[i]["text"].upper() for i in (5, 2, 9)]
    spool.remove()
    assert not spool.path.exists()


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_spooled_split_is_the_split_of_the_same_rows_in_a_list(tmp_path, seed):
    shuffled = ROWS[:]
    random.Random(seed).shuffle(shuffled)
    _, rows = _spooled(tmp_path, shuffled)
    from_list, from_spool = split_rows(shuffled, 0.2, 0.2, seed), split_rows(rows, 0.2, 0.2, seed)
    assert {name: list(part) for name, part in from_spool.items()} == from_list
    assert data_version(from_spool, {"r": 1}) == data_version(from_list, {"r": 1})


def test_the_data_version_is_the_same_as_joining_every_row_hash_as_text():
    rows = [{"text": f"row {i} ü", "label": "ab"[i % 2]} for i in range(70_000)]  # more than one hex block
    splits = {"train": rows[:60_000], "eval": rows[60_000:], "test": rows[:1]}
    assert data_version(splits, {"recipe": 2}) == _version_as_before(splits, {"recipe": 2})


def test_dedupe_keeps_the_first_of_the_same_text_and_refuses_the_first_contradicting_label(tmp_path):
    rows = [
        {"text": "Hello there", "label": "a"},
        {"text": "other", "label": "b"},
        {"text": "hello  THERE!", "label": "a"},  # the same text: dropped
        {"text": "other", "label": "b"},  # dropped
        {"text": "third", "label": "c"},
    ]
    _, spooled = _spooled(tmp_path, rows)
    kept, dropped = dedupe(spooled, ("text",), "data.source", labelled=True)
    assert list(kept) == [rows[0], rows[1], rows[4]] and dropped == 2
    contradicting = [*rows, {"text": "THIRD", "label": "a"}, {"text": "hello there", "label": "b"}]
    _, spooled = _spooled(tmp_path, contradicting)
    with pytest.raises(
        DataError, match=r"data.source: the text 'third' \(also as 'THIRD'\) appears with labels 'c' and 'a'"
    ):
        dedupe(spooled, ("text",), "data.source", labelled=True)
    kept, dropped = dedupe(spooled, ("text",), "data.source", labelled=False)  # groups, not labels: first stands
    assert list(kept) == [rows[0], rows[1], rows[4]] and dropped == 4
