"""The job spec reference, docs/spec-reference.md, rendered from the JSON Schema that `rentune schema` prints.

    python -m jobspec.reference           rewrite docs/spec-reference.md
    python -m jobspec.reference --check   exit 1 when the file is not what the schema gives

One table per spec section, nested objects flattened with dotted names (`data.split.eval`, list items as
`guardrails[].metric`), with each field's type (constraints resolved: `int ≥ 1`, `"warn" | "fail"`), default,
whether it is required and its description. Everything comes from `JobSpec.model_json_schema()`, except the
defaults of fields whose default is built by a factory (a list, a nested section), which a JSON Schema does not
carry: those are read from the same pydantic models. The output depends on nothing but the schema.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from jobspec import schema as spec_models
from jobspec.schema import JobSpec

__all__ = ["COMMAND", "DOC", "main", "refresh", "render", "spec_schema"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"
COMMAND = "python -m jobspec.reference"


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec, exactly as `rentune schema` prints it."""
    return JobSpec.model_json_schema()


def _models() -> dict[str, type[BaseModel]]:
    """Every pydantic model of jobspec/schema.py by class name, which is also its name under `$defs`."""
    return {
        name: value
        for name, value in sorted(vars(spec_models).items())
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
    }


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _literal(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _bounds(node: dict[str, Any], name: str) -> str:
    low = high = None
    if "minimum" in node:
        low = f"{_number(node['minimum'])} ≤"
    if "exclusiveMinimum" in node:
        low = f"{_number(node['exclusiveMinimum'])} <"
    if "maximum" in node:
        high = f"≤ {_number(node['maximum'])}"
    if "exclusiveMaximum" in node:
        high = f"< {_number(node['exclusiveMaximum'])}"
    if low and high:
        return f"{low} {name} {high}"
    if low:
        value, operator = low.rsplit(" ", 1)
        return f"{name} {'≥' if operator == '≤' else '>'} {value}"
    if high:
        return f"{name} {high}"
    return name


def _sized(text: str, node: dict[str, Any], low_key: str, high_key: str, unit: str) -> str:
    low, high = node.get(low_key), node.get(high_key)
    if low is not None and high is not None:
        return f"{text}, {_number(low)} to {_number(high)} {unit}s"
    if low is not None:
        return f"{text}, at least {_number(low)} {unit}{'' if low == 1 else 's'}"
    if high is not None:
        return f"{text}, at most {_number(high)} {unit}{'' if high == 1 else 's'}"
    return text


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the `$defs` name, the definition) for a `$ref` node (or one wrapped in a single allOf), else (None, node)."""
    if "allOf" in node and len(node["allOf"]) == 1:
        node = node["allOf"][0]
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return name, defs[name]
    return None, node


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A readable type: `int ≥ 1`, `"warn" | "fail"`, `list of str`, `float | null`."""
    name, node = _resolve(node, defs)
    if name is not None:
        return "object"
    if "anyOf" in node:
        return " | ".join(_type(option, defs) for option in node["anyOf"])
    if "const" in node:
        return _literal(node["const"])
    if "enum" in node:
        return " | ".join(_literal(value) for value in node["enum"])
    kind = node.get("type")
    if kind == "array":
        item = _type(node.get("items", {}), defs)
        text = f"list of ({item})" if " | " in item else f"list of {item}"
        return _sized(text, node, "minItems", "maxItems", "item")
    if kind == "object":
        if "properties" in node:
            return "object"
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return f"mapping of str to {_type(extra, defs)}"
        return "mapping (any keys)"
    if kind == "string":
        text = "datetime (ISO 8601)" if node.get("format") == "date-time" else "str"
        if "pattern" in node:
            text += f" matching `{node['pattern']}`"
        return _sized(text, node, "minLength", "maxLength", "char")
    if kind == "integer":
        return _bounds(node, "int")
    if kind == "number":
        return _bounds(node, "float")
    if kind == "boolean":
        return "bool"
    if kind == "null":
        return "null"
    return "any"


def _objects(node: dict[str, Any], defs: dict[str, Any], suffix: str = "") -> list[tuple[str, str, dict[str, Any]]]:
    """The object definitions a field holds directly, as (`$defs` name, name suffix, definition): the field itself,
    one option of an anyOf, or a list's items (`[]`)."""
    name, resolved = _resolve(node, defs)
    if name is not None:
        return [(name, suffix, resolved)]
    found = []
    for option in resolved.get("anyOf", []):
        found += _objects(option, defs, suffix)
    if resolved.get("type") == "array" and "items" in resolved:
        found += _objects(resolved["items"], defs, suffix + "[]")
    return found


def _default(owner: str, field: str, node: dict[str, Any], models: dict[str, type[BaseModel]]) -> str:
    if "default" in node:
        return _literal(node["default"])
    model = models.get(owner)
    info = model.model_fields.get(field) if model is not None else None
    if info is None or info.is_required():
        return "-"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "`{}`"
    return _literal(value)


def _description(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """The field's description, then that of each object it holds and of its list items, where they differ."""
    parts = [node.get("description", "")]
    _, resolved = _resolve(node, defs)
    parts.append(resolved.get("description", ""))
    for _, _, definition in _objects(node, defs):
        parts.append(definition.get("description", ""))
    items = resolved.get("items")
    if isinstance(items, dict):
        parts.append(items.get("description", ""))
    seen: list[str] = []
    for part in parts:
        text = " ".join(part.split())
        if text and text not in seen:
            seen.append(text)
    return " ".join(seen)


_TAG = re.compile(r"<(?=[A-Za-z/!?])")


def _cell(text: str) -> str:
    """Text safe in a table cell: `|` escaped, and a `<` that could open an HTML tag outside code spans
    (`trials/<id>/`) kept visible."""
    pieces = text.replace("|", "\\|").split("`")
    return "`".join(piece if index % 2 else _TAG.sub("&lt;", piece) for index, piece in enumerate(pieces))


def _rows(
    prefix: str, owner: str, definition: dict[str, Any], defs: dict[str, Any], models: dict[str, type[BaseModel]]
) -> list[str]:
    rows = []
    required = set(definition.get("required", []))
    for field, node in definition.get("properties", {}).items():
        name = f"{prefix}.{field}"
        cells = (
            f"`{name}`",
            _type(node, defs),
            _default(owner, field, node, models),
            "yes" if field in required else "no",
            _description(node, defs),
        )
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        for child, suffix, child_definition in _objects(node, defs):
            rows += _rows(name + suffix, child, child_definition, defs, models)
    return rows


def render(schema: dict[str, Any] | None = None) -> str:
    """The markdown reference of every field of the job spec (`schema`: the JSON Schema, default the spec's)."""
    schema = spec_schema() if schema is None else schema
    defs = schema.get("$defs", {})
    models = _models()
    required = set(schema.get("required", []))
    lines = [
        "# Job spec reference",
        "",
        "Every field of the job spec, generated from the JSON Schema that `rentune schema` prints.",
        "",
        f"Generated from `jobspec/schema.py` by `{COMMAND}`: do not edit this file by hand. After a change to the "
        f"schema, run `{COMMAND}`; `{COMMAND} --check` and `tests/unit/test_spec_reference.py` fail while this "
        "file is stale. How the sections fit together, with examples and the rules a table cannot hold: "
        "[jobspec.md](jobspec.md).",
        "",
        " ".join(schema.get("description", "").split()),
        "",
        "Names are dotted paths in the YAML file; `[]` marks the fields of each item of a list. *required* says "
        "whether a field must be given when the object holding it is present; `-` means no default. Unknown keys "
        "are errors everywhere.",
        "",
        "Sections: " + ", ".join(f"[`{field}`](#{field})" for field in schema.get("properties", {})) + ".",
    ]
    for field, node in schema.get("properties", {}).items():
        lines += ["", f"## {field}", ""]
        status = "Required." if field in required else f"Optional, default {_default('JobSpec', field, node, models)}."
        description = _description(node, defs)
        lines += [f"`{field}`: {_type(node, defs)}. {status}" + (f" {description}" if description else ""), ""]
        lines += ["| field | type | default | required | description |", "| --- | --- | --- | --- | --- |"]
        objects = _objects(node, defs)
        if not objects:
            lines.append(
                "| "
                + " | ".join(
                    _cell(cell) for cell in (f"`{field}`", _type(node, defs), "-", "-", _description(node, defs))
                )
                + " |"
            )
        for owner, suffix, definition in objects:
            lines += _rows(field + suffix, owner, definition, defs, models)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Render the job spec reference from the schema.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale instead of rewriting it")
    parser.add_argument("--file", type=Path, default=DOC, help="the reference file (default: docs/spec-reference.md)")
    args = parser.parse_args(argv)
    return refresh(args.file, render(), COMMAND, args.check, "the job spec schema changed")


def refresh(file: Path, text: str, command: str, check: bool, why: str) -> int:
    """Write a generated page, or with `check` only say whether `file` holds `text` (exit code 1 when it
    does not: `why` it would be stale, `command` rewrites it). The spec reference and the CLI reference
    (entrypoint/cli_reference.py) both go through here."""
    shown = _shown(file)
    if check:
        current = file.read_text(encoding="utf-8") if file.is_file() else None
        if current != text:
            what = "is missing" if current is None else f"is stale ({why})"
            print(f"{shown} {what}: run `{command}` to rewrite it", file=sys.stderr)
            return 1
        print(f"{shown} is current")
        return 0
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text, encoding="utf-8")
    print(f"wrote {shown}")
    return 0


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
