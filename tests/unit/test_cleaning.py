from __future__ import annotations

from entrypoint.data.cleaning import apply_rules, rule_ids
from jobspec.schema import MaxChars

ROWS = [
    {"text": "<p>Hello&nbsp;<b>world</b></p>", "label": "a"},
    {"text": "  spaced   out \t text  ", "label": "a"},
    {"text": "   ", "label": "b"},
    {"text": "x" * 50, "label": "b"},
]


def test_rules_apply_in_order_and_count_what_they_touched():
    rules = ["strip_html", "normalize_ws", "drop_empty", MaxChars(max_chars=10)]
    rows, touched = apply_rules(ROWS, ["text"], rules)
    assert [r["text"] for r in rows] == ["Hello worl", "spaced out", "x" * 10]
    assert touched == {"strip_html@1": 1, "normalize_ws@1": 3, "drop_empty@1": 1, "max_chars=10@1": 3}
    assert ROWS[0]["text"].startswith("<p>")  # inputs are not changed in place


def test_normalize_ws_keeps_single_newlines():
    rows, _ = apply_rules([{"text": "line one  \n  line two\n\n\n\nend", "label": "a"}], ["text"], ["normalize_ws"])
    assert rows[0]["text"] == "line one\nline two\n\nend"


def test_rule_ids_carry_parameters_and_versions():
    assert rule_ids(["drop_empty", MaxChars(max_chars=7)]) == ["drop_empty@1", "max_chars=7@1"]
