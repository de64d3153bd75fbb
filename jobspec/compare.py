"""Two specs of one job, compared by what they say rather than by their bytes.

A job's spec is frozen in the store at its start; every later `rentune run` of the same job.id brings its
own copy. Comments, key order and quoting do not matter: the parsed content does. Where a file lives does
not matter either: a node that mounts the base model at another path, or reads the data from a copy, runs
the same job. The fields in LOCATIONS name places, not content; what they point at is checked by content
elsewhere (the base model's sha256 before any phase uses it, the committed data version, which later phases
read from the store instead of the source).

    differences(stored, running)  ->  [Difference(field, stored, running), ...]   every field, dotted
    locate(stored, running)       ->  (the stored spec at the running spec's locations, the moved fields)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jobspec.schema import JobSpec

__all__ = ["LOCATIONS", "Difference", "differences", "locate", "with_locations"]

# Where things are, not what they are. A location may change between runs of one job; switching kinds of
# source (model.path to model.hub_id, data.source to data.files) is a change of content.
LOCATIONS = (
    "model.path",
    "data.source",
    "data.files.train",
    "data.files.eval",
    "data.files.test",
    "store.uri",
    "store.endpoint_url",
    "store.region",
    "store.addressing_style",
)


class Difference(NamedTuple):
    field: str  # dotted path, list items as [i]: training.learning_rate, experiments[1].lora.r
    stored: Any
    running: Any

    def __str__(self) -> str:
        return f"{self.field}: stored {_show(self.stored)}, yours {_show(self.running)}"


def differences(stored: JobSpec, running: JobSpec) -> list[Difference]:
    """Every field whose value differs between the two specs (defaults filled in), in spec order."""
    found: list[Difference] = []
    _walk("", stored.model_dump(mode="json"), running.model_dump(mode="json"), found)
    return found


def locate(stored: JobSpec, running: JobSpec) -> tuple[JobSpec, dict[str, Any], list[Difference]]:
    """The stored spec, moved to the running spec's locations. Returns it, the moved fields (dotted name ->
    running value) and the differences that are not moves (empty when the running spec continues the job).
    A location counts as moved only when both specs set it: one set and one unset is a change of source."""
    moved, changed = {}, []
    for difference in differences(stored, running):
        if difference.field in LOCATIONS and difference.stored is not None and difference.running is not None:
            moved[difference.field] = difference.running
        else:
            changed.append(difference)
    return with_locations(stored, moved), moved, changed


def with_locations(spec: JobSpec, moved: dict[str, Any]) -> JobSpec:
    """`spec` with the location fields in `moved` (dotted name -> value) set. Raises ValueError for a field
    that is not a location, so that nothing but places can be changed this way."""
    if not moved:
        return spec
    data = spec.model_dump(mode="json", exclude_unset=True)
    for field, value in moved.items():
        if field not in LOCATIONS:
            raise ValueError(f"{field}: not a location field (expected one of {', '.join(LOCATIONS)})")
        *parents, last = field.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return JobSpec.model_validate(data)


def _walk(prefix: str, stored: Any, running: Any, found: list[Difference]) -> None:
    if isinstance(stored, dict) and isinstance(running, dict):
        for key in list(stored) + [k for k in running if k not in stored]:
            _walk(f"{prefix}.{key}" if prefix else key, stored.get(key), running.get(key), found)
    elif isinstance(stored, list) and isinstance(running, list) and len(stored) == len(running):
        for index, (one, other) in enumerate(zip(stored, running, strict=True)):
            _walk(f"{prefix}[{index}]", one, other, found)
    elif stored != running:
        found.append(Difference(prefix, stored, running))


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    if value is None:
        text = "(not set)"
    return text if len(text) <= 80 else text[:77] + "..."
