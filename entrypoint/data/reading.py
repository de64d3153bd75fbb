"""Reading examples from a local file, folder or an s3:// object: JSONL, Parquet, or a folder written by
`datasets.Dataset.save_to_disk` (Arrow files). Each row is checked and reduced to the canonical fields the
task needs; every error names the file and the row (the JSONL line; the Parquet row with its row group).

Parquet and Arrow rows are counted from 0, as pyarrow, pandas and `datasets` count them; JSONL lines from 1,
as editors count them."""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from entrypoint.errors import InvalidInput
from entrypoint.store.hashing import file_sha256
from jobspec.local_inputs import local_inputs
from jobspec.schema import JobSpec, Store

__all__ = [
    "MAX_ERRORS",
    "DataError",
    "FIRST_ROWS",
    "WHERE",
    "RawFile",
    "json_objects",
    "open_source",
    "records",
    "refuse",
    "row_byte_limit",
    "cluster_of",
    "first_rows_problems",
    "text_rows",
]

WHERE = "_where"  # a row's file and line while it is read (data/text.py drops the key before spooling)
MAX_ERRORS = 20  # lines listed in one error: enough to see the pattern, short enough to read
# The most a text row may hold: no model sees more than model.max_length tokens of it, and a token rarely
# spans more than a few dozen bytes; a larger row only costs memory (a 50 MB row took 6 GB to parse).
ROW_BYTES_PER_TOKEN = 64
ROW_BYTES_FLOOR = 1_000_000


def row_byte_limit(max_length: int) -> int:
    """The largest row, in bytes, a text source may hold: max(1 MB, 64 bytes x model.max_length)."""
    return max(ROW_BYTES_FLOOR, ROW_BYTES_PER_TOKEN * max_length)


PARQUET_MAGIC = b"PAR1"


class DataError(InvalidInput):
    """Input data that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True)
class RawFile:
    """A source as found, before any row is parsed: a local file (for a bucket object, its downloaded
    copy) read as a stream, never whole. `format` is jsonl, parquet or dataset (a `save_to_disk` folder,
    whose Arrow files are `files`, in the dataset's order)."""

    name: str  # as the user wrote it, for messages
    path: Path | None
    format: str = "jsonl"
    files: tuple[tuple[str, Path], ...] = ()
    max_row_bytes: int | None = None  # rows larger than this are errors (row_byte_limit), read no further

    @property
    def sha256(self) -> str:
        """The source's content hash: the file's bytes, or a saved dataset's Arrow files by name."""
        if self.format != "dataset":
            return file_sha256(self.path)
        digest = hashlib.sha256()
        for name, path in self.files:
            digest.update(f"{name}\0{file_sha256(path)}\n".encode())
        return digest.hexdigest()


@contextmanager
def open_source(location: str, store_options: Store, field: str) -> Iterator[RawFile]:
    """A local path (`file://` allowed) or an `s3://bucket/key`: a JSONL or Parquet file, or a saved
    dataset's folder (prefix). `field` names the spec field in errors. Relative local paths resolve
    against the working directory. A bucket's files are downloaded to a temporary folder, removed on exit."""
    if not location.startswith("s3://"):
        yield _local(location, field)
        return
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
    key = key.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="rentune-source-") as folder:
        local = Path(folder) / "source"
        try:
            store.get_file(key, local)
            found = True
        except ObjectNotFound:
            found = False
        if found:
            yield _typed(location, local, field)
            return
        if store.head(f"{key}/state.json") is None and store.head(f"{key}/dataset_dict.json") is None:
            raise DataError(f"{field}: {location}: no such object (nor a saved dataset's state.json under it)")

        def fetch(name: str) -> Path | None:
            try:
                store.get_file(f"{key}/{name}", local / name)
            except ObjectNotFound:
                return None
            return local / name

        local.mkdir()
        yield _saved_dataset(location, fetch, field)


def _local(location: str, field: str) -> RawFile:
    path = Path(location.removeprefix("file://"))
    if path.is_dir():
        return _saved_dataset(location, lambda name: path / name if (path / name).is_file() else None, field)
    if not path.is_file():
        folder = path.parent
        near = sorted(p.name for p in folder.iterdir() if p.suffix in (".jsonl", ".parquet")) if folder.is_dir() else []
        hint = f"; files there: {', '.join(near[:5])}" if near else ""
        raise DataError(f"{field}: file not found ({path}, resolved from {Path.cwd()}){hint}")
    return _typed(location, path, field)


def _typed(name: str, path: Path, field: str) -> RawFile:
    """A file's format from its content (Parquet starts with PAR1) or its name."""
    with path.open("rb") as file:
        magic = file.read(4)
    if magic == PARQUET_MAGIC:
        return RawFile(name, path, "parquet")
    if name.endswith(".parquet"):
        raise DataError(
            f"{field}: {name}: not a Parquet file (it does not start with the Parquet magic bytes PAR1); "
            "expected Parquet, or rename a JSONL file to .jsonl"
        )
    return RawFile(name, path, "jsonl")


def _saved_dataset(name: str, find: Callable[[str], Path | None], field: str) -> RawFile:
    """A `datasets.Dataset.save_to_disk` folder: `state.json` lists its Arrow files in order. `find` gives
    a file of the folder as a local path, or None."""
    state = find("state.json")
    if state is None:
        splits = find("dataset_dict.json")
        if splits is not None:
            names = json.loads(splits.read_bytes()).get("splits", [])
            raise DataError(
                f"{field}: {name} is a DatasetDict (splits {', '.join(names)}); point {field} at one split's "
                f"folder (e.g. {name.rstrip('/')}/{names[0] if names else 'train'})"
            )
        raise DataError(
            f"{field}: {name} is a folder without state.json; expected a JSONL or Parquet file, or a folder "
            "written by datasets' save_to_disk"
        )
    try:
        files = [entry["filename"] for entry in json.loads(state.read_bytes())["_data_files"]]
    except (ValueError, KeyError, TypeError) as exc:
        what = f"unreadable ({exc!r}); expected the state.json save_to_disk writes"
        raise DataError(f"{field}: {name}/state.json: {what}") from None
    contents = []
    for file in files:
        path = find(file)
        if path is None:
            raise DataError(f"{field}: {name}/{file}: listed in state.json but missing; save the dataset again")
        contents.append((file, path))
    return RawFile(name, None, "dataset", tuple(contents))


def records(raw: RawFile, errors: list[str]) -> Iterator[tuple[str, dict]]:
    """(where, object) for every row of `raw` in order, read as a stream (a Parquet row group, an Arrow
    record batch at a time); `where` names the file and the row for messages. Rows that are not objects
    add an error to `errors` instead (JSONL). Raises DataError for a file that cannot be read at all,
    naming the damaged part."""
    if raw.format == "jsonl":
        for number, obj in json_objects(raw, errors):
            yield f"{raw.name}:{number}", obj
        return
    for where, obj in _arrow_records(raw, errors):
        size = _text_bytes(obj) if raw.max_row_bytes else 0
        if raw.max_row_bytes and size > raw.max_row_bytes:
            errors.append(_too_large(where, size, raw.max_row_bytes))
            continue
        yield where, obj


def _too_large(where: str, size: int, limit: int) -> str:
    return (
        f"{where}: {size:,} bytes in one row; expected at most {limit:,} bytes, the limit for text rows "
        f"(max(1 MB, {ROW_BYTES_PER_TOKEN} bytes x model.max_length): the model never sees more); shorten the row"
    )


def _text_bytes(value) -> int:
    """About the bytes a row's values hold (characters of its strings), without encoding them."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_bytes(v) for v in value.values())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    return 8


def _arrow_records(raw: RawFile, errors: list[str]) -> Iterator[tuple[str, dict]]:
    import pyarrow as pa

    count = 0
    if raw.format == "parquet":
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(str(raw.path), memory_map=True)
        except (pa.ArrowException, OSError) as exc:
            what = f"not a readable Parquet file ({_one_line(exc)}); write the file again"
            raise DataError(f"{raw.name}: {what}") from None
        for group in range(parquet.num_row_groups):
            try:
                table = parquet.read_row_group(group)
            except (pa.ArrowException, OSError) as exc:
                rows = parquet.metadata.row_group(group).num_rows
                raise DataError(
                    f"{raw.name}: row group {group} (rows {count} to {count + rows - 1}) cannot be read "
                    f"({_one_line(exc)}); the file is damaged: write it again"
                ) from None
            for index, obj in enumerate(table.to_pylist()):
                yield f"{raw.name}: row {count} (row group {group}, index {index})", _without_nulls(obj)
                count += 1
    else:
        for file, path in raw.files:
            try:
                reader = pa.ipc.open_stream(pa.memory_map(str(path)))
                index = 0
                for batch in reader:
                    for obj in batch.to_pylist():
                        yield f"{raw.name}/{file}: row {count} (index {index} in this file)", _without_nulls(obj)
                        count += 1
                        index += 1
            except (pa.ArrowException, OSError) as exc:
                what = f"not a readable Arrow file ({_one_line(exc)}); save the dataset again"
                raise DataError(f"{raw.name}/{file}: {what}") from None
    if count == 0:
        raise DataError(f"{raw.name}: no examples (no rows); expected one example per row")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _without_nulls(value):
    """Arrow gives every struct all of its column's fields, with None for those a row lacks; a field that is
    null is treated as absent, as in JSONL."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def a_type(value) -> str:
    """`value`'s type with its article, for messages: "an int", "a list"."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def cluster_of(obj: dict, field: str, where: str, errors: list[str]) -> str | None:
    """A row's cluster (data.cluster_field) as text, or None after adding an error naming the row."""
    value = obj.get(field)
    if value is None or isinstance(value, dict | list) or value == "":
        what = "missing" if value is None else "empty" if value == "" else a_type(value)
        errors.append(f"{where}: field {field!r} (data.cluster_field) is {what}; expected a text or number id")
        return None
    return str(value)


def text_rows(
    raw: RawFile,
    wanted: Mapping[str, str],
    declared: Sequence[str] | None,
    group_field: str | None,
    errors: list[str],
    cluster_field: str | None = None,
) -> Iterator[dict]:
    """Canonical rows, one at a time: each `wanted` canonical name (e.g. "text", "label") -> the value of its
    field in the row (`{"text": "body", "label": "category"}`), which must be text. With `group_field`,
    "label" is that field's value when present (its group, for per-group metrics), "all" otherwise. Labels
    outside `declared` are errors. Bad rows are appended to `errors` (file and row named) and skipped: call
    `refuse(errors)` once the rows are consumed."""
    declared_set = set(declared) if declared else None
    for where, obj in records(raw, errors):
        row, bad = {}, False
        for canonical, name in wanted.items():
            value = obj.get(name)
            if not isinstance(value, str):
                what = "missing" if value is None else a_type(value)
                errors.append(f"{where}: field {name!r} (data.{canonical}_field) is {what}; expected text")
                bad = True
            else:
                row[canonical] = value
        if group_field is not None:
            group = obj.get(group_field, "all")
            row["label"] = group if isinstance(group, str) else str(group)
        if cluster_field is not None:
            row["cluster"] = cluster_of(obj, cluster_field, where, errors)
            bad = bad or row["cluster"] is None
        if not bad and declared_set is not None and row["label"] not in declared_set:
            allowed = ", ".join(sorted(declared_set))
            errors.append(f"{where}: label {row['label']!r} is not one of data.labels ({allowed})")
            bad = True
        if not bad:
            row[WHERE] = where
            yield row


def json_objects(raw: RawFile, errors: list[str]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every line of a JSONL file that is a JSON object, in file order, read a
    line at a time; each other line adds an error naming the file and line to `errors` when it is reached,
    so the caller's own errors interleave in line order. Lines end with `\\n` only (JSON Lines): U+2028 or
    U+0085 inside a string is text. Raises DataError at the first line that is not UTF-8."""
    seen = False
    with raw.path.open("rb") as file:
        for number, data in enumerate(file, start=1):
            try:
                line = data.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{raw.name}:{number}: not UTF-8 (byte 0x{data[exc.start]:02x} at column {exc.start + 1}); "
                    "expected UTF-8 text (re-encode the file, e.g. with iconv -t UTF-8)"
                ) from None
            if not line.strip():
                continue
            seen = True
            if raw.max_row_bytes and len(data) > raw.max_row_bytes:
                errors.append(_too_large(f"{raw.name}:{number}", len(data), raw.max_row_bytes))
                continue
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
                    f"{raw.name}:{number}: a string holds a lone surrogate escape (such as \\ud800), which is "
                    "not text; expected valid Unicode (a pair such as \\ud83d\\ude00 is fine)"
                )
                continue
            yield number, obj
    if not seen:
        raise DataError(
            f"{raw.name}: no examples (the file is empty or holds only blank lines); expected one JSON object per line"
        )


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


FIRST_ROWS = 20  # rows validate reads from the start of each data file: enough to catch a wrong format


def first_rows_problems(spec: JobSpec) -> list[str]:
    """What `rentune validate` checks of the data before any model library is imported: data.source or each
    of data.files, when local text data: it exists, and its first FIRST_ROWS rows are JSON objects (JSONL) or
    readable (Parquet, a saved dataset; image rows in JSONL alike). A folder of images: that it exists."""
    problems = []
    for field, path in local_inputs(spec).items():
        if not field.startswith(("data.source", "data.files.")):
            continue
        if path.is_dir() and not any((path / name).is_file() for name in ("state.json", "dataset_dict.json")):
            continue  # a folder the kind reads itself (an ImageFolder); a saved dataset's is read below
        errors: list[str] = []
        try:
            with open_source(str(path), spec.store, field) as raw:
                list(islice(records(raw, errors), FIRST_ROWS))
        except DataError as exc:
            problems.append(str(exc))
        problems += [f"{field}: {error}" for error in errors[:5]]
    return problems
