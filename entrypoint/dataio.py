"""Reading examples: JSONL from a local file or an s3:// object, each row checked and reduced to the
canonical fields the task needs. Every error names the file and the line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jobspec.schema import Data, Store

__all__ = ["DataError", "RawFile", "read_source", "rows_from_jsonl"]


class DataError(ValueError):
    """Input data that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True)
class RawFile:
    name: str  # as the user wrote it, for messages
    data: bytes


def read_source(location: str, store_options: Store, field: str) -> RawFile:
    """Bytes of a local path (`file://` allowed) or an `s3://bucket/key` object. `field` names the spec
    field in errors. Relative local paths resolve against the working directory."""
    if location.startswith("s3://"):
        from entrypoint.store import ObjectNotFound
        from entrypoint.store.s3 import S3Store

        bucket, _, key = location[len("s3://") :].partition("/")
        if not key:
            raise DataError(f"{field}: {location}: expected s3://bucket/key")
        store = S3Store.from_uri(
            f"s3://{bucket}",
            endpoint_url=store_options.endpoint_url,
            region=store_options.region,
            addressing_style=store_options.addressing_style,
        )
        try:
            return RawFile(location, store.get_bytes(key))
        except ObjectNotFound:
            raise DataError(f"{field}: {location}: no such object") from None
    path = Path(location.removeprefix("file://"))
    try:
        return RawFile(location, path.read_bytes())
    except FileNotFoundError:
        near = sorted(p.name for p in path.parent.glob("*.jsonl")) if path.parent.is_dir() else []
        hint = f"; files there: {', '.join(near[:5])}" if near else ""
        raise DataError(f"{field}: file not found ({path}, resolved from {Path.cwd()}){hint}") from None
    except IsADirectoryError:
        raise DataError(f"{field}: {path} is a folder; expected a JSONL file") from None


def rows_from_jsonl(raw: RawFile, data: Data, causal: bool) -> list[dict]:
    """Canonical rows: {"text", "label"} for classification, {"prompt", "response", "label"} for causal LMs
    (label = the row's group, "all" when the row has none). Raises DataError listing up to 20 bad lines."""
    if causal:
        wanted = {"prompt": data.prompt_field, "response": data.response_field}
    else:
        wanted = {"text": data.text_field, "label": data.label_field}
    declared = set(data.labels) if data.labels else None
    rows, errors = [], []
    try:
        lines = raw.data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{raw.name}: not UTF-8 text ({exc})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{raw.name}:{number}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            errors.append(f"{raw.name}:{number}: expected a JSON object, got {type(obj).__name__}")
            continue
        row, bad = {}, False
        for canonical, name in wanted.items():
            value = obj.get(name)
            if not isinstance(value, str):
                what = "missing" if value is None else f"a {type(value).__name__}"
                errors.append(f"{raw.name}:{number}: field {name!r} (data.{canonical}_field) is {what}; expected text")
                bad = True
            else:
                row[canonical] = value
        if causal:
            group = obj.get(data.label_field, "all")
            row["label"] = group if isinstance(group, str) else str(group)
        if not bad and declared is not None and row["label"] not in declared:
            errors.append(
                f"{raw.name}:{number}: label {row['label']!r} is not one of data.labels ({', '.join(sorted(declared))})"
            )
            bad = True
        if not bad:
            rows.append(row)
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise DataError("\n".join(shown))
    return rows
