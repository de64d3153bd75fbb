"""Where a job's state lives in the store, and how it is read and written.

    <root>/jobs/<job_id>/spec.yaml                  frozen spec
                        phases/<phase>/result.json  a phase's commit, written last
                        trials/<trial_id>/...       checkpoints, result.json, eval/
                        attempts/<n>/...            one folder per process start (attempts.py)

Every stored JSON object goes through `dumps` (stable bytes) and `read_json` (unreadable content becomes
an error naming the key). JSONL follows the JSON Lines definition: records end with `\\n`, nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from entrypoint.errors import Conflict, InvalidInput
from entrypoint.job import layout
from entrypoint.store import ObjectExists, ObjectNotFound, PrefixedStore, Store
from entrypoint.store.objects import CorruptObject, read_json
from jobspec.compare import locate
from jobspec.load import LoadedSpec, SpecError, parse_spec
from jobspec.schema import JOB_ID_PATTERN

__all__ = [
    "Continued",
    "PHASE_NAMES",
    "JobConflict",
    "dumps",
    "continue_spec",
    "freeze_spec",
    "job_store",
    "jsonl_lines",
    "read_json",
    "read_jsonl",
    "read_result",
    "stored_spec",
    "to_jsonl",
]


# The phases in the order the runner runs them (runner.PHASES binds each name to its module).
PHASE_NAMES = ("data", "baseline", "probe", "train", "evaluate", "test", "verify", "report", "export")


class JobConflict(Conflict):
    """The store already holds this job id with a different spec; nothing was overwritten."""


def job_store(root: Store, job_id: str) -> Store:
    """The job's own prefix, `jobs/<job_id>/`: a phase can read and write nothing outside it. A job id that
    could not be a spec's job.id (`../x`, `A/b`) is refused here, for every command that takes one."""
    if not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise InvalidInput(
            f"job id {job_id!r}: expected what a spec's job.id can be: 1 to 63 lowercase letters, digits, '-' "
            "or '_', starting with a letter or digit"
        )
    return PrefixedStore(root, layout.root_job(job_id))


def dumps(obj: Any) -> bytes:
    """Stable JSON bytes for the store: sorted keys, indented, trailing newline."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def to_jsonl(rows: Iterable[dict]) -> bytes:
    return "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows).encode()


def jsonl_lines(data: bytes) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line. Lines end with `\\n` only (JSON Lines): U+2028 or U+0085
    inside a string is text, not a line break. Raises UnicodeDecodeError for bytes that are not UTF-8."""
    for number, line in enumerate(data.decode("utf-8").split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip():
            yield number, line


def read_jsonl(data: bytes, name: str = "<jsonl>") -> list[dict]:
    """Rows rentune itself wrote (`to_jsonl`); a line that is not JSON is an error naming `name` and the line."""
    rows = []
    for number, line in jsonl_lines(data):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}:{number}: not valid JSON ({exc.msg})") from None
    return rows


def read_result(store: Store, phase: str) -> dict | None:
    """A phase's committed result, or None when the phase has not committed."""
    try:
        return read_json(store, layout.phase_result(phase))
    except ObjectNotFound:
        return None


def freeze_spec(store: Store, loaded: LoadedSpec) -> Continued:
    """Store the spec once; a later run of the job continues under the stored spec. Its spec may differ in
    comments, formatting and locations (jobspec/compare.py), and in nothing else: any other difference is
    refused (JobConflict naming every field), never overwritten."""
    try:
        store.put_if_absent(layout.SPEC, loaded.text.encode())
        return Continued(loaded, {}, {})
    except ObjectExists:
        return continue_spec(store, loaded)


def continue_spec(store: Store, loaded: LoadedSpec) -> Continued:
    """The stored spec at `loaded`'s locations, for a process that brings its own copy of the job's spec
    (freeze_spec on the lead, a follower node). Raises JobConflict naming every field that differs otherwise."""
    stored = stored_spec(store)  # an unreadable stored spec is named as such (CorruptObject), not as "another spec"
    if stored.sha256 == loaded.sha256:
        return Continued(loaded, {}, {})
    located, moved, changed = locate(stored.spec, loaded.spec)
    if changed:
        listed = "; ".join(str(difference) for difference in changed[:20])
        more = f" (and {len(changed) - 20} more)" if len(changed) > 20 else ""
        raise JobConflict(
            f"job.id {loaded.spec.job.id!r}: {store.uri}/spec.yaml holds this job with another spec; "
            f"{len(changed)} field(s) differ: {listed}{more}. Choose a new job.id to start a new job, or run "
            "the stored spec to continue it"
        )
    was = {field: _dotted(stored.spec, field) for field in moved}
    return Continued(LoadedSpec(located, stored.text, stored.sha256, loaded.source), moved, was)


class Continued(NamedTuple):
    """The spec a run works under: the stored one at this node's locations (`moved`: dotted field -> value,
    empty when nothing moved; `was`: what the stored spec says there), with the stored spec's sha256 as the
    job's identity."""

    loaded: LoadedSpec
    moved: dict
    was: dict

    def lines(self) -> list[str]:
        """One line per moved location, for the log."""
        return [
            f"spec: {field} is {value!r} on this node (the stored spec says {self.was[field]!r}): a move, if what "
            "it holds is the same (checked by content before it is used)"
            for field, value in self.moved.items()
        ]


def _dotted(spec, field: str):
    value = spec
    for part in field.split("."):
        value = getattr(value, part)
    return value


def stored_spec(store: Store) -> LoadedSpec:
    """The job's frozen spec, as every process after the first (torchrun ranks, the recheck process, status) reads it.
    Raises ObjectNotFound, or CorruptObject naming the object when it is no longer a valid spec."""
    where = f"{store.uri}/spec.yaml"
    try:
        return parse_spec(store.get_bytes(layout.SPEC).decode("utf-8"), source=where)
    except UnicodeDecodeError as exc:
        problem = f"{where}: not UTF-8 (byte {exc.start})"
        raise CorruptObject(f"{problem}; expected the spec frozen at the job's start") from None
    except SpecError as exc:
        problems = "; ".join(exc.errors[:3])
        raise CorruptObject(f"{problems}; expected the spec frozen at the job's start (was it overwritten?)") from None
