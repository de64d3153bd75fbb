"""Text data (`data.modality: text`): the spec's sources (JSONL, Parquet, saved datasets) read a chunk at a
time, cleaned, spooled and exactly de-duplicated (data/text.py), the leak check on each row's text, and
the inspection of examples as the trainer sees them. Which fields a row has, and how its text reads for
the leak check, the model side says (`TextFields`): a text and a label for a classifier, a prompt and a
response (or a conversation) for a causal LM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from entrypoint.data.parts import DataParts, Leaks
from entrypoint.data.reading import RawFile
from entrypoint.data.text import read_text_parts, text_inspection, text_leaks, text_recipe
from jobspec.schema import JobSpec

__all__ = ["TextData", "TextFields"]


@dataclass(frozen=True)
class TextFields:
    """How a model side's rows come out of the user's files."""

    wanted: Mapping[str, str]  # row key -> the spec's field name it is read from
    keys: Sequence[str]  # the row keys that make two rows the same example (de-duplication)
    leak_text: Callable[[dict], str]  # the text the leak check compares
    recipe_task: str  # recorded in the recipe: "classification" | "causal_lm"
    group_field: str | None = None  # a group per row (not a label to predict), for per-group metrics
    parse: Callable[[RawFile, list[str]], Iterator[dict]] | None = None  # replaces the field reader (chat)
    clean: Callable[[list[dict]], tuple[list[dict], dict]] | None = None  # replaces per-field cleaning
    recipe_extra: Callable[[object], dict] = field(default=lambda processor: {})  # from the processor
    trains: Callable[[dict], bool] | None = None  # False: the row trains on nothing at max_length (data.truncation)


class TextData:
    def __init__(self, spec: JobSpec, fields: TextFields, model):
        self.spec, self.fields, self.model = spec, fields, model  # model: its encode, for the inspection

    def read(self, folder: Path, log: Callable[[str], None]) -> DataParts:
        f = self.fields
        return read_text_parts(
            self.spec,
            folder,
            log,
            f.wanted,
            f.keys,
            group_field=f.group_field,
            parse=f.parse,
            clean=f.clean,
            trains=f.trains,
        )

    def find_leaks(self, splits: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> Leaks:
        return text_leaks(splits, pairs, self.spec.data.leaks.near_threshold, self.fields.leak_text)

    def commit_splits(self, store, splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
        return splits  # the rows themselves are canonical

    def identity(self, row: dict) -> dict:
        return row  # a text row is its content

    def recipe(self, folder: Path, processor) -> dict:
        return {**text_recipe(self.spec, folder, self.fields.recipe_task), **self.fields.recipe_extra(processor)}

    def inspect(self, processor, splits: dict[str, list[dict]], labels: list[str], encoded) -> tuple[dict, str, dict]:
        encode = lambda rows: self.model.encode(processor, rows, labels)  # noqa: E731
        return text_inspection(self.spec, encode, processor, splits, labels, encoded)

    def fetch(self, store, rows: list[dict], workdir: Path) -> list[dict]:
        return rows  # everything is in the row
