"""Format adherence and field extraction metrics for the generated text of a causal LM.

Pure Python on output strings (no torch), so baseline, trained model and verification share one definition.
Every report holds `metrics` (flat name -> float, what guardrails read; `higher_is_better` gives the direction)
and `examples` (one record per output, for auditing). `FORMATS_VERSION` is recorded in every eval config; bump it
when a definition changes.

JSON is parsed strictly: `json.loads` on the whole output after stripping surrounding whitespace, so prose or a
code fence around the JSON makes it invalid, and so do the non-JSON constants NaN and Infinity.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from jsonschema import exceptions, validators

__all__ = ["FORMATS_VERSION", "check_format", "extraction_report", "format_report", "higher_is_better"]

FORMATS_VERSION = "formats-1"

_MAX_SCHEMA_ERRORS = 3
_MAX_MESSAGE = 160  # jsonschema messages repeat the instance; long outputs would flood the audit records
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_LOWER_IS_BETTER = ("extra_field_rate", "type_error_rate")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse(output: str) -> tuple[Any, str | None]:
    """(value, None) or (None, short error) for the stripped output."""
    try:
        return json.loads(output.strip(), parse_constant=_reject_constant), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg} (line {e.lineno} column {e.colno})"
    except ValueError as e:
        return None, f"invalid JSON: {e}"


def _check(output: str, validator: Any, pattern: re.Pattern[str] | None, expect_json: bool) -> dict:
    errors: list[str] = []
    json_valid = schema_valid = regex_match = None
    if expect_json:
        value, error = _parse(output)
        json_valid = error is None
        errors += [error] if error else []
        if validator is not None:
            found = sorted(validator.iter_errors(value), key=lambda e: (e.json_path, e.message)) if json_valid else []
            schema_valid = json_valid and not found
            errors += [f"schema: {e.json_path}: {e.message}"[:_MAX_MESSAGE] for e in found[:_MAX_SCHEMA_ERRORS]]
    if pattern is not None:
        regex_match = pattern.fullmatch(output.strip()) is not None
        errors += [] if regex_match else ["regex: no full match"]
    valid = all(check is not False for check in (json_valid, schema_valid, regex_match))
    return {
        "json_valid": json_valid,
        "schema_valid": schema_valid,
        "regex_match": regex_match,
        "valid": valid,
        "errors": errors,
    }


def _settings(json_schema: dict | None, regex: str | None, expect_json: bool) -> tuple[Any, re.Pattern[str] | None]:
    """(validator, compiled regex), either None when not asked for. The validator class follows the schema's
    declared $schema (Draft 2020-12 when absent or unknown). ValueError for an invalid schema or regex."""
    validator = pattern = None
    if json_schema is not None:
        if not expect_json:
            raise ValueError("json_schema needs expect_json=True: a schema is checked against the parsed JSON")
        cls = validators.validator_for(json_schema, default=validators.Draft202012Validator)
        try:
            cls.check_schema(json_schema)
        except exceptions.SchemaError as e:
            raise ValueError(f"json_schema is invalid at {e.json_path}: {e.message}") from None
        validator = cls(json_schema)
    if regex is not None:
        try:
            pattern = re.compile(regex)
        except re.error as e:
            raise ValueError(f"regex {regex!r} does not compile: {e}") from None
    return validator, pattern


def check_format(
    output: str, *, json_schema: dict | None = None, regex: str | None = None, expect_json: bool = True
) -> dict:
    """Check one output: strict JSON (if `expect_json`), the JSON Schema (if given), `re.fullmatch` of `regex` on
    the stripped output (if given). A check that does not apply is None; `valid` is True when every check that
    applies passed; `errors` holds short messages (at most 3 schema errors, each "schema: <path>: <message>").
    Raises ValueError if the schema or the regex is invalid, or a schema is given with `expect_json=False`.
    """
    validator, pattern = _settings(json_schema, regex, expect_json)
    return _check(output, validator, pattern, expect_json)


def _lengths(outputs: Sequence[str], other: Sequence | None, name: str) -> None:
    if isinstance(outputs, str) or not outputs:
        raise ValueError("outputs must be a non-empty sequence of strings")
    if other is not None and len(other) != len(outputs):
        raise ValueError(f"{name} has {len(other)} entries but outputs has {len(outputs)}")


def _rate(flags: Sequence[bool]) -> float:
    return sum(map(bool, flags)) / len(flags)


def format_report(
    outputs: Sequence[str],
    *,
    json_schema: dict | None = None,
    regex: str | None = None,
    expect_json: bool = True,
    groups: Sequence[str] | None = None,
) -> dict:
    """`check_format` on every output, with rates: format_valid_rate, json_valid_rate (if `expect_json`),
    schema_valid_rate (if a schema), regex_match_rate (if a regex), and "format_valid_rate/<group>" per group.
    Raises ValueError on empty `outputs`, `groups` of another length, or an invalid schema or regex.
    """
    _lengths(outputs, groups, "groups")
    validator, pattern = _settings(json_schema, regex, expect_json)
    examples = [_check(output, validator, pattern, expect_json) for output in outputs]
    metrics = {"format_valid_rate": _rate([e["valid"] for e in examples])}
    applies = {"json_valid": expect_json, "schema_valid": validator is not None, "regex_match": pattern is not None}
    metrics.update({f"{check}_rate": _rate([e[check] for e in examples]) for check in applies if applies[check]})
    per_group = {}
    for group in sorted(set(groups or ())):
        valid = [e["valid"] for e, g in zip(examples, groups, strict=True) if g == group]
        per_group[group] = {"n": len(valid), "format_valid_rate": _rate(valid)}
        metrics[f"format_valid_rate/{group}"] = per_group[group]["format_valid_rate"]
    return {
        "metrics_version": FORMATS_VERSION,
        "n": len(examples),
        "examples": examples,
        "metrics": metrics,
        "per_group": per_group,
    }


def _json_type(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "bool"  # before int: bool is a subclass of int
    return {int: "number", float: "number", str: "string", list: "list", dict: "object"}.get(type(value), "other")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but "1" != 1 and True != 1, also inside lists and objects."""
    if _json_type(a) != _json_type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _normalize(value: Any) -> Any:
    """Comparable form: strings NFKC, casefolded, whitespace collapsed, one trailing '.' dropped; numbers and
    numeric strings as Decimal; lists and object values recursively; bools tagged so True != 1."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return Decimal(str(value))
    if isinstance(value, str):
        text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", value).casefold())
        text = " ".join(text.split()).removesuffix(".").rstrip()
        return Decimal(text) if _NUMBER.fullmatch(text) else text
    if isinstance(value, list):
        return [_normalize(item) for item in value]
    if isinstance(value, dict):
        return {key: _normalize(item) for key, item in value.items()}
    return value


def _golds(golds: Sequence[dict | str]) -> list[dict]:
    """Each gold as a dict; ValueError listing every index that is not a JSON object."""
    parsed, problems = [], []
    for i, gold in enumerate(golds):
        value = _parse(gold)[0] if isinstance(gold, str) else gold
        if not isinstance(value, dict):
            problems.append(f"golds[{i}]: not a JSON object ({str(gold)[:40]!r})")
        parsed.append(value)
    if problems:
        raise ValueError("; ".join(problems))
    return parsed


def _score(output: str, gold: dict, fields: Sequence[str], required: Sequence[str]) -> dict:
    value, error = _parse(output)
    is_object = error is None and isinstance(value, dict)
    out = value if is_object else {}  # not an object: nothing present, so every field below comes out wrong

    def right(field: str, same: Callable[[Any, Any], bool]) -> bool:
        return same(out[field], gold.get(field)) if field in out else is_object and field not in gold

    return {
        "json_valid": is_object,
        "required_present": is_object and all(f in out for f in required),
        "missing": [f for f in required if f not in out],
        "extra": sorted(k for k in out if k not in fields and k not in gold),
        "type_errors": [f for f in fields if f in out and f in gold and _json_type(out[f]) != _json_type(gold[f])],
        "exact": {f: right(f, _equal) for f in fields},
        "normalized": {f: right(f, lambda a, b: _normalize(a) == _normalize(b)) for f in fields},
    }


def extraction_report(
    outputs: Sequence[str],
    golds: Sequence[dict | str],
    *,
    required_fields: Sequence[str],
    fields: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
) -> dict:
    """Score outputs that should be JSON objects against gold objects, field by field.

    `fields` are scored for accuracy (default: the union of gold keys, sorted). A field is right when the output
    value equals the gold (exact: JSON types must match; normalized: see `_normalize`). A field missing from the
    output is right only if it is missing from gold too; an output value for a field gold lacks is compared with
    null. Output that is not a JSON object gets every field wrong and no required field present. `missing`
    lists the required fields absent from the output. Raises ValueError on empty input, lengths that differ,
    empty `required_fields`, no fields to score, or a gold that is not a JSON object (naming its index).
    """
    _lengths(outputs, golds, "golds")
    _lengths(outputs, groups, "groups")
    if not required_fields:
        raise ValueError("required_fields is empty: name the fields every output must contain")
    parsed_golds = _golds(golds)
    fields = list(fields) if fields is not None else sorted({k for gold in parsed_golds for k in gold})
    if not fields:
        raise ValueError("no fields to score: golds are all empty objects and `fields` was not given")
    examples = [_score(o, g, fields, required_fields) for o, g in zip(outputs, parsed_golds, strict=True)]

    def accuracy(records: Sequence[dict], kind: str, names: Sequence[str]) -> float:
        return _rate([r[kind][f] for r in records for f in names])

    metrics = {
        "json_valid_rate": _rate([e["json_valid"] for e in examples]),
        "required_present_rate": _rate([e["required_present"] for e in examples]),
        **{f"required_present_rate/{f}": _rate([f not in e["missing"] for e in examples]) for f in required_fields},
        "field_accuracy": accuracy(examples, "exact", fields),
        "field_accuracy_normalized": accuracy(examples, "normalized", fields),
        **{f"field_accuracy/{f}": accuracy(examples, "exact", [f]) for f in fields},
        **{f"field_accuracy_normalized/{f}": accuracy(examples, "normalized", [f]) for f in fields},
        "extra_field_rate": _rate([bool(e["extra"]) for e in examples]),
        "type_error_rate": _rate([bool(e["type_errors"]) for e in examples]),
    }
    per_group = {}
    for group in sorted(set(groups or ())):
        members = [e for e, g in zip(examples, groups, strict=True) if g == group]
        present, acc = _rate([e["required_present"] for e in members]), accuracy(members, "exact", fields)
        per_group[group] = {"n": len(members), "required_present_rate": present, "field_accuracy": acc}
        metrics[f"required_present_rate@{group}"], metrics[f"field_accuracy@{group}"] = present, acc
    return {
        "metrics_version": FORMATS_VERSION,
        "n": len(examples),
        "fields": fields,
        "required_fields": list(required_fields),
        "examples": examples,
        "metrics": metrics,
        "per_group": per_group,
    }


def higher_is_better(metric: str) -> bool:
    """False for extra_field_rate and type_error_rate (and any metric named after them), True otherwise."""
    return not metric.startswith(_LOWER_IS_BETTER)
