from __future__ import annotations

import pytest

from entrypoint.evaluation.formats import (
    FORMATS_VERSION,
    check_format,
    extraction_report,
    format_report,
    higher_is_better,
)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

VALID = '{"name": "Ada", "age": 36}'
MISSING_AGE = '{"name": "Ada"}'
TRAILING_COMMA = '{"name": "Ada", "age": 36,}'
PROSE_BEFORE = 'Sure! {"name": "Ada", "age": 36}'
EXTRA_FIELD = '{"name": "Ada", "age": 36, "email": "ada@example.com"}'


# --- check_format -----------------------------------------------------------------------------------------------


def test_valid_json_matching_schema_passes_every_check():
    result = check_format("  " + VALID + "\n", json_schema=PERSON)  # surrounding whitespace is stripped
    assert result == {"json_valid": True, "schema_valid": True, "regex_match": None, "valid": True, "errors": []}


def test_missing_required_field_is_schema_invalid():
    result = check_format(MISSING_AGE, json_schema=PERSON)
    assert (result["json_valid"], result["schema_valid"], result["valid"]) == (True, False, False)
    assert result["errors"] == ["schema: $: 'age' is a required property"]


@pytest.mark.parametrize("output", [TRAILING_COMMA, PROSE_BEFORE, '```json\n{"a": 1}\n```', '{"a": NaN}'])
def test_invalid_json_fails_json_and_schema(output):
    result = check_format(output, json_schema=PERSON)
    assert (result["json_valid"], result["schema_valid"], result["valid"]) == (False, False, False)
    assert len(result["errors"]) == 1 and result["errors"][0].startswith("invalid JSON: ")


def test_extra_field_fails_schema_with_additional_properties_false():
    result = check_format(EXTRA_FIELD, json_schema=PERSON)
    assert (result["json_valid"], result["schema_valid"]) == (True, False)
    assert result["errors"] == ["schema: $: Additional properties are not allowed ('email' was unexpected)"]


def test_wrong_type_reports_path():
    result = check_format('{"name": "Ada", "age": "36"}', json_schema=PERSON)
    assert result["errors"] == ["schema: $.age: '36' is not of type 'integer'"]


def test_at_most_three_schema_errors_sorted_by_path():
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcde"}}
    result = check_format('{"e": "x", "d": "x", "c": "x", "b": "x", "a": "x"}', json_schema=schema)
    assert result["schema_valid"] is False
    assert [e.split(":")[1].strip() for e in result["errors"]] == ["$.a", "$.b", "$.c"]


def test_json_only_without_schema():
    assert check_format("[1, 2]") == {
        "json_valid": True,
        "schema_valid": None,
        "regex_match": None,
        "valid": True,
        "errors": [],
    }


def test_declared_draft_is_used():
    # Draft 4: exclusiveMaximum is a boolean modifying maximum; in Draft 2020-12 (the default) it must be a number.
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "maximum": 10, "exclusiveMaximum": True}
    assert check_format("9", json_schema=draft4)["schema_valid"] is True
    assert check_format("10", json_schema=draft4)["schema_valid"] is False
    without_declaration = {k: v for k, v in draft4.items() if k != "$schema"}
    with pytest.raises(ValueError, match="json_schema is invalid"):
        check_format("9", json_schema=without_declaration)


def test_regex_adherence_on_stripped_output():
    pattern = r"[A-Z]{3}-\d{4}"
    assert check_format(" ABC-1234\n", regex=pattern, expect_json=False)["regex_match"] is True
    result = check_format("ABC-1234 and more", regex=pattern, expect_json=False)  # fullmatch, not search
    assert result == {
        "json_valid": None,
        "schema_valid": None,
        "regex_match": False,
        "valid": False,
        "errors": ["regex: no full match"],
    }


def test_regex_and_json_both_apply():
    result = check_format('{"id": "A1"}', regex=r'\{"id": "[A-Z]\d"\}')
    assert (result["json_valid"], result["regex_match"], result["valid"]) == (True, True, True)
    result = check_format('{"id": "a1"}', regex=r'\{"id": "[A-Z]\d"\}')
    assert (result["json_valid"], result["regex_match"], result["valid"]) == (True, False, False)


# --- format_report ----------------------------------------------------------------------------------------------


def test_format_report_rates_and_groups_by_hand():
    outputs = [VALID, MISSING_AGE, TRAILING_COMMA, PROSE_BEFORE, EXTRA_FIELD]
    report = format_report(outputs, json_schema=PERSON, groups=["a", "a", "b", "b", "b"])
    # valid: only VALID -> 1/5. JSON parses: VALID, MISSING_AGE, EXTRA_FIELD -> 3/5. Schema: only VALID -> 1/5.
    # group a = [VALID, MISSING_AGE] -> 1/2; group b = [TRAILING_COMMA, PROSE_BEFORE, EXTRA_FIELD] -> 0/3.
    assert report["metrics"] == {
        "format_valid_rate": 0.2,
        "json_valid_rate": 0.6,
        "schema_valid_rate": 0.2,
        "format_valid_rate/a": 0.5,
        "format_valid_rate/b": 0.0,
    }
    assert report["per_group"] == {"a": {"n": 2, "format_valid_rate": 0.5}, "b": {"n": 3, "format_valid_rate": 0.0}}
    assert (report["metrics_version"], report["n"]) == (FORMATS_VERSION, 5)
    assert [e["valid"] for e in report["examples"]] == [True, False, False, False, False]


def test_format_report_regex_only_has_no_json_metric():
    outputs = ["ABC-1234", " XYZ-0001\n", "ABC-1234 extra", "abc-1234"]
    report = format_report(outputs, regex=r"[A-Z]{3}-\d{4}", expect_json=False)
    # matches: ABC-1234, XYZ-0001 (stripped) -> 2/4; the other two do not fullmatch.
    assert report["metrics"] == {"format_valid_rate": 0.5, "regex_match_rate": 0.5}
    assert report["per_group"] == {}


# --- extraction_report ------------------------------------------------------------------------------------------

GOLDS = [
    {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"]},
    {"name": "Alan Turing", "age": 41, "tags": ["cs"]},
    '{"name": "Grace Hopper", "age": 85, "tags": ["navy", "cobol"]}',  # a gold may be a JSON string
    {"name": "Bob", "age": 30, "tags": []},
]
OUTPUTS = [
    '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"]}',  # all exact
    '{"name": "alan  turing.", "age": "41", "tags": ["CS"], "email": "a@b.c"}',  # all normalized-only; extra; type
    '{"name": "Grace Hopper", "tags": ["navy", "cobol"]}',  # age missing
    'Sure! {"name": "Bob", "age": 30, "tags": []}',  # not JSON
]


def test_extraction_report_by_hand():
    report = extraction_report(OUTPUTS, GOLDS, required_fields=["name", "age"], groups=["en", "en", "fr", "fr"])
    assert report["fields"] == ["age", "name", "tags"]
    assert report["required_fields"] == ["name", "age"]
    m = report["metrics"]
    assert m["json_valid_rate"] == 0.75  # 3 of 4 parse
    assert m["required_present_rate"] == 0.5  # outputs 0 and 1
    assert m["required_present_rate/name"] == 0.75  # 0, 1, 2
    assert m["required_present_rate/age"] == 0.5  # 0, 1
    # exact per example (age, name, tags): 0 -> 3, 1 -> 0, 2 -> name+tags = 2, 3 -> 0; 5 of 12
    assert m["field_accuracy"] == pytest.approx(5 / 12)
    # normalized: 0 -> 3, 1 -> 3, 2 -> 2, 3 -> 0; 8 of 12
    assert m["field_accuracy_normalized"] == pytest.approx(8 / 12)
    assert (m["field_accuracy/age"], m["field_accuracy_normalized/age"]) == (0.25, 0.5)
    assert (m["field_accuracy/name"], m["field_accuracy_normalized/name"]) == (0.5, 0.75)
    assert (m["field_accuracy/tags"], m["field_accuracy_normalized/tags"]) == (0.5, 0.75)
    assert (m["extra_field_rate"], m["type_error_rate"]) == (0.25, 0.25)  # both only in output 1
    # en = outputs 0, 1: required 2/2, exact (3 + 0) / 6. fr = outputs 2, 3: required 0/2, exact (2 + 0) / 6.
    assert (m["required_present_rate@en"], m["field_accuracy@en"]) == (1.0, 0.5)
    assert (m["required_present_rate@fr"], m["field_accuracy@fr"]) == (0.0, pytest.approx(1 / 3))
    assert report["per_group"]["en"] == {"n": 2, "required_present_rate": 1.0, "field_accuracy": 0.5}
    assert len(m) == 18  # 4 required + 2 overall accuracy + 6 per-field + 2 rates + 4 per-group
    assert all(isinstance(v, float) for v in m.values())


def test_extraction_example_records():
    examples = extraction_report(OUTPUTS, GOLDS, required_fields=["name", "age"])["examples"]
    assert examples[1] == {
        "json_valid": True,
        "required_present": True,
        "missing": [],
        "extra": ["email"],
        "type_errors": ["age"],  # "41" (string) vs 41 (number); tags are lists on both sides
        "exact": {"age": False, "name": False, "tags": False},
        "normalized": {"age": True, "name": True, "tags": True},
    }
    assert (examples[2]["required_present"], examples[2]["missing"]) == (False, ["age"])
    assert examples[3] == {
        "json_valid": False,
        "required_present": False,
        "missing": ["name", "age"],
        "extra": [],
        "type_errors": [],
        "exact": {"age": False, "name": False, "tags": False},
        "normalized": {"age": False, "name": False, "tags": False},
    }


def test_wrong_type_exact_wrong_normalized_right():
    report = extraction_report(['{"age": "42"}'], [{"age": 42}], required_fields=["age"])
    assert report["examples"][0]["exact"] == {"age": False}
    assert report["examples"][0]["normalized"] == {"age": True}
    assert report["metrics"]["type_error_rate"] == 1.0


def test_normalization_cases():
    gold = {
        "city": "New York",
        "wide": "ABC",
        "price": 3.5,
        "count": 42,
        "items": [["a b", "C."], ["d"]],
        "meta": {"unit": "Kg"},
        "flag": True,
        "note": None,
    }
    output = (
        '{"city": "  new   YORK. ", "wide": "\uff21\uff22\uff23", "price": "3.50", "count": "42",'
        ' "items": [["A \\t B", "c"], ["D."]], "meta": {"unit": "kg."}, "flag": true, "note": null}'
    )
    example = extraction_report([output], [gold], required_fields=["city"])["examples"][0]
    assert example["normalized"] == dict.fromkeys(gold, True)
    # exact: only flag and note are identical -> 2 of 8
    assert [f for f, ok in example["exact"].items() if ok] == ["flag", "note"]
    assert example["type_errors"] == ["count", "price"]  # fields are sorted: the two numeric strings


def test_exact_and_normalized_keep_json_types_apart():
    gold = {"a": True, "b": "1", "c": [1, 2], "d": 1, "e": [True], "f": "yes"}
    output = '{"a": 1, "b": 1.0, "c": [1], "d": 1.0, "e": [1], "f": "no"}'
    example = extraction_report([output], [gold], required_fields=["a"])["examples"][0]
    # True vs 1 differs; "1" vs 1.0 differs exactly but not normalized; 1 vs 1.0 equal; list lengths differ.
    assert example["exact"] == {"a": False, "b": False, "c": False, "d": True, "e": False, "f": False}
    assert example["normalized"] == {"a": False, "b": True, "c": False, "d": True, "e": False, "f": False}
    assert example["type_errors"] == ["a", "b"]  # bool vs number, string vs number


def test_missing_fields_and_nulls():
    golds = [{"a": 1}, {"a": 1, "x": 2}, {"a": 1, "x": None}, {"a": 1}]
    outputs = ['{"a": 1}', '{"a": 1}', '{"a": 1}', '{"a": 1, "x": null}']
    report = extraction_report(outputs, golds, required_fields=["a"])
    # x: 0 absent in both -> right; 1 absent from output only -> wrong; 2 gold null, output absent -> wrong;
    # 3 output null, gold absent -> compared with null -> right (and not an extra field: x is scored).
    assert [e["exact"]["x"] for e in report["examples"]] == [True, False, False, True]
    assert report["metrics"]["field_accuracy"] == 0.75  # a: 4/4, x: 2/4 -> 6/8
    assert report["metrics"]["extra_field_rate"] == 0.0


def test_null_value_counts_as_present_and_non_object_is_invalid():
    report = extraction_report(['{"a": null}', "[1, 2]", "7"], [{"a": 1}] * 3, required_fields=["a"])
    assert [e["required_present"] for e in report["examples"]] == [True, False, False]
    assert [e["json_valid"] for e in report["examples"]] == [True, False, False]
    assert report["metrics"]["field_accuracy"] == 0.0


def test_unparseable_output_is_wrong_even_for_fields_gold_lacks():
    report = extraction_report(["{", '{"a": 1}'], [{"a": 1}, {"a": 1, "b": 2}], required_fields=["a"])
    assert report["examples"][0]["exact"] == {"a": False, "b": False}
    assert report["metrics"]["field_accuracy"] == 0.25  # only output 1's "a"


def test_explicit_fields_limit_scoring_and_extra():
    report = extraction_report(['{"a": 1, "b": 9, "c": 3}'], [{"a": 1, "b": 2}], required_fields=["a"], fields=["a"])
    assert report["fields"] == ["a"]
    assert report["examples"][0]["extra"] == ["c"]  # b is in gold, so not extra
    assert report["metrics"]["field_accuracy"] == 1.0


# --- errors and direction ---------------------------------------------------------------------------------------


def test_format_report_errors():
    with pytest.raises(ValueError, match="non-empty"):
        format_report([])
    with pytest.raises(ValueError, match="non-empty"):
        format_report("{}")
    with pytest.raises(ValueError, match="groups has 1 entries but outputs has 2"):
        format_report(["{}", "{}"], groups=["a"])
    with pytest.raises(ValueError, match="json_schema is invalid"):
        format_report(["{}"], json_schema={"type": "nonsense"})
    with pytest.raises(ValueError, match="json_schema is invalid"):
        check_format("{}", json_schema={"type": "object", "required": "name"})
    with pytest.raises(ValueError, match="does not compile"):
        format_report(["x"], regex="(", expect_json=False)
    with pytest.raises(ValueError, match="expect_json=True"):
        format_report(["x"], json_schema=PERSON, expect_json=False)


def test_extraction_report_errors():
    with pytest.raises(ValueError, match="non-empty"):
        extraction_report([], [], required_fields=["a"])
    with pytest.raises(ValueError, match="golds has 1 entries but outputs has 2"):
        extraction_report(["{}", "{}"], [{"a": 1}], required_fields=["a"])
    with pytest.raises(ValueError, match="groups has 3 entries"):
        extraction_report(["{}"], [{"a": 1}], required_fields=["a"], groups=["x", "y", "z"])
    with pytest.raises(ValueError, match="required_fields is empty"):
        extraction_report(["{}"], [{"a": 1}], required_fields=[])
    with pytest.raises(ValueError, match="no fields to score"):
        extraction_report(["{}"], [{}], required_fields=["a"])
    with pytest.raises(ValueError) as error:
        extraction_report(["{}"] * 3, [{"a": 1}, "[1, 2]", "not json"], required_fields=["a"])
    assert "golds[1]" in str(error.value) and "golds[2]" in str(error.value) and "golds[0]" not in str(error.value)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("extra_field_rate", False),
        ("type_error_rate", False),
        ("type_error_rate@en", False),
        ("field_accuracy", True),
        ("field_accuracy_normalized/age", True),
        ("format_valid_rate/a", True),
        ("required_present_rate@fr", True),
    ],
)
def test_higher_is_better(metric, expected):
    assert higher_is_better(metric) is expected
