"""Reading examples: JSONL from a local file or an s3:// object, each row checked and reduced to the
canonical fields the task needs. Every error names the file and the line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from entrypoint.errors import InvalidInput
from entrypoint.job.state import jsonl_lines
from jobspec.schema import Store

__all__ = ["MAX_ERRORS", "DataError", "RawFile", "json_objects", "read_source", "refuse", "rows_from_jsonl"]

MAX_ERRORS = 20  # lines listed in one error: enough to see the pattern, short enough to read


class DataError(InvalidInput):
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


def rows_from_jsonl(
    raw: RawFile, wanted: Mapping[str, str], declared: Sequence[str] | None, group_field: str | None = None
) -> list[dict]:
    """Canonical rows: each `wanted` canonical name (e.g. "text", "label") -> the value of its field in the
    row (`{"text": "body", "label": "category"}`), which must be text. With `group_field`, "label" is that
    field's value when present (its group, for per-group metrics), "all" otherwise. Labels outside
    `declared` are errors. Raises DataError listing up to 20 bad lines, each naming file and line."""
    declared_set = set(declared) if declared else None
    rows, errors = [], []
    for number, obj in json_objects(raw, errors):
        row, bad = {}, False
        for canonical, name in wanted.items():
            value = obj.get(name)
            if not isinstance(value, str):
                what = "missing" if value is None else f"a {type(value).__name__}"
                errors.append(f"{raw.name}:{number}: field {name!r} (data.{canonical}_field) is {what}; expected text")
                bad = True
            else:
                row[canonical] = value
        if group_field is not None:
            group = obj.get(group_field, "all")
            row["label"] = group if isinstance(group, str) else str(group)
        if not bad and declared_set is not None and row["label"] not in declared_set:
            allowed = ", ".join(sorted(declared_set))
            errors.append(f"{raw.name}:{number}: label {row['label']!r} is not one of data.labels ({allowed})")
            bad = True
        if not bad:
            rows.append(row)
    refuse(errors)
    return rows


def json_objects(raw: RawFile, errors: list[str]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every line of a JSONL file that is a JSON object, in file order; each
    other line adds an error naming the file and line to `errors` when it is reached, so the caller's own
    errors interleave in line order. Raises DataError if the file is not UTF-8."""
    try:
        lines = list(jsonl_lines(raw.data))
    except UnicodeDecodeError as exc:
        line = raw.data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(
            f"{raw.name}:{line}: not UTF-8 (byte 0x{raw.data[exc.start]:02x} at column {column}); "
            "expected UTF-8 text (re-encode the file, e.g. with iconv -t UTF-8)"
        ) from None
    if not lines:
        raise DataError(
            f"{raw.name}: no examples (the file is empty or holds only blank lines); expected one JSON object per line"
        )
    for number, line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{raw.name}:{number}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            errors.append(f"{raw.name}:{number}: expected a JSON object, got {type(obj).__name__}")
            continue
        if _LONE_SURROGATE.search(line) and not _is_unicode(obj):
            errors.append(
                f"{raw.name}:{number}: a string holds a lone surrogate escape (such as \\ud800), which is not "
                "text; expected valid Unicode (a pair such as \\ud83d\\ude00 is fine)"
            )
            continue
        yield number, obj


# An escape of a UTF-16 surrogate: JSON allows it, but alone (without its pair) it decodes to no character.
_LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _is_unicode(obj: object) -> bool:
    """True if every string in `obj` (keys included) encodes to UTF-8, i.e. holds no lone surrogate."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse(errors: list[str], most: int = MAX_ERRORS) -> None:
    """Raise one DataError with the first `most` errors (enough to see the pattern) and how many more."""
    if errors:
        shown = errors[:most] + ([f"... and {len(errors) - most} more"] if len(errors) > most else [])
        raise DataError("\n".join(shown))
