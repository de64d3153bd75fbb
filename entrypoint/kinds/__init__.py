"""What differs between jobs, in three small protocols, bundled once from the spec by `kind_for`:

    DataSide    one per modality: read the sources, find leaks, commit and fetch the splits, what
                identifies an example, the recipe and the inspection
                    text.py         JSONL / Parquet / saved datasets, text fields or conversations
                    images.py       ImageFolder or JSONL of image files, stored content-addressed
    ModelSide   one per model family: the processor, encoding, batching, loading, predicting, the
                untouched model's baseline and the settings that decide a measurement
                    text_classifier.py   an encoder with a new head; zero-shot baseline
                    image_classifier.py  a vision model with a new head; centroid baseline
                    causal_lm.py         prompt -> generated response; untouched-model baseline
    TaskSide    one per task: scoring, per-example counts for the intervals, the loss weighting, the
                eval settings and what the report shows
                    classification.py    format.py    extraction.py

Phases never ask which kind they run: they call `ctx.kind.data`, `ctx.kind.model` and `ctx.kind.task`.
Adding a modality, a model family or a task is one new module implementing its protocol, its spec
fields in jobspec/schema.py and a line in `kind_for` (docs/adding-a-kind.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from entrypoint.data.encoding import Encoded
from entrypoint.data.parts import DataParts, Leaks
from entrypoint.evaluation.tally import Tally
from jobspec.schema import Adaptation, JobSpec

__all__ = ["Baseline", "DataSide", "Kind", "ModelSide", "TaskSide", "encoder_for", "kind_for"]


@dataclass(frozen=True)
class Baseline:
    outputs: list[str]
    method: dict  # how they were obtained; goes into the eval config


class DataSide(Protocol):
    """The examples, from the user's files to the rows each phase reads. Raises DataError naming file and
    line (or file name) for anything unusable."""

    def read(self, folder: Path, log: Callable[[str], None]) -> DataParts:
        """Read, check, clean and de-duplicate the sources (spooling rows to `folder` when the modality
        streams them; progress to `log`)."""

    def find_leaks(self, splits: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> Leaks:
        """Exact and near duplicates between the split pairs (`(checked side, other side)`)."""

    def commit_splits(self, store, splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
        """The canonical rows each later phase reads, by split; stores whatever they point to (images)."""

    def identity(self, row: dict) -> dict:
        """What identifies an example (its content, never a file name or local path): the seeded split
        orders rows by it and the data version hashes it."""

    def recipe(self, folder: Path, processor) -> dict:
        """Everything besides the examples that decides what training sees (versions, hashes, settings)."""

    def inspect(
        self, processor, splits: dict[str, list[dict]], labels: list[str], encoded: dict | None
    ) -> tuple[dict, str, dict]:
        """The inspection (JSON), its markdown, and extra files to store (name -> bytes). `encoded`: the
        splits as the data phase stored them (Kind.stores_tokens), else None."""

    def fetch(self, store, rows: list[dict], workdir: Path) -> list[dict]:
        """Committed rows made ready for the model on this node (images downloaded and checked)."""


class ModelSide(Protocol):
    """The model: what it reads, how it is built or reloaded, and what it answers."""

    def processor(self, folder: Path):
        """What turns a row into model inputs: the tokenizer, or the image processor."""

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list[Encoded]:
        """Every row exactly as the trainer sees it."""

    def collator(self, processor) -> Any:
        """Pads or stacks a list of encoded features into a batch."""

    def load(self, folder: Path, labels: Sequence[str], adaptation: Adaptation, trained: Path | None = None):
        """`trained` None: the model to train from the base model in `folder`, LoRA-wrapped or fully
        trainable (ModelError for unusable settings). Else the trained weights in `trained` loaded the way
        a user loads them: base + adapter, or the saved full model."""

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        """The model's output for each row: a label, or the generated response."""

    def baseline(self, folder: Path, processor, rows: Sequence[dict], labels: Sequence[str], device, train) -> Baseline:
        """The untouched model's outputs on `rows` (`train`: a callable returning the train split)."""

    def settings(self) -> dict:
        """What besides the task decides a measurement (decoding, template, image modes)."""


class TaskSide(Protocol):
    """What is measured, and how a trial is trained towards it."""

    name: str  # hypothesis.task: "classification" | "format" | "extraction"
    # How the loss of an accumulated batch is weighted: one label per sequence ("example"), or every
    # response token counted once across the accumulated batch ("token").
    loss: Literal["example", "token"]
    breakdown: str  # the per-category, per-field or per-group metric the report's bar plot shows

    def score(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> dict:
        """The task's report; its flat `metrics` dict (name -> value) is what guardrails read."""

    def tally(self, rows: Sequence[dict], outputs: Sequence[str], labels: Sequence[str]) -> Tally:
        """Per-example counts whose sums give every metric of `score` (evaluation/tally.py)."""

    def settings(self) -> dict:
        """The task's part of the eval config (metric versions, format rule, fields)."""

    def notes(self) -> list[str]:
        """What a reader of the report should know about how this task scores."""


@dataclass(frozen=True)
class Kind:
    """One job's three sides. `stores_tokens`: the data phase stores the encoded splits (data/tokens.py)
    that later phases memory-map; otherwise (pixels) each phase encodes the rows it reads."""

    name: str  # "text_classifier" | "image_classifier" | "causal_lm"
    data: DataSide
    model: ModelSide
    task: TaskSide
    stores_tokens: bool


def kind_for(spec: JobSpec, log: Callable[[str], None] | None = None) -> Kind:
    """The kind of job `spec` describes: images -> image classifier; format and extraction tasks generate
    text -> causal LM; classification of text -> text classifier. `log`: where the model side reports as
    it goes (generation throughput)."""
    from entrypoint.kinds.classification import Classification
    from entrypoint.kinds.extraction import Extraction
    from entrypoint.kinds.format import Format

    task = {"classification": Classification, "format": Format, "extraction": Extraction}[spec.hypothesis.task](spec)
    if spec.data.modality == "image":
        from entrypoint.kinds.image_classifier import ImageClassifier
        from entrypoint.kinds.images import ImageData

        model = ImageClassifier(spec)
        return Kind("image_classifier", ImageData(spec, model), model, task, stores_tokens=False)
    from entrypoint.kinds.text import TextData

    if spec.hypothesis.task in ("format", "extraction"):
        from entrypoint.kinds.causal_lm import CausalLM

        model = CausalLM(spec, log)
        return Kind("causal_lm", TextData(spec, model.fields(), model), model, task, stores_tokens=True)
    from entrypoint.kinds.text_classifier import TextClassifier

    model = TextClassifier(spec)
    return Kind("text_classifier", TextData(spec, model.fields(), model), model, task, stores_tokens=True)


def encoder_for(spec: JobSpec, model_dir: str, labels: list[str]) -> Callable[[Sequence[dict]], list[Encoded]]:
    """The model side's encoder for `spec`, with its processor loaded once: what each tokenizing process of
    the data phase runs (data/tokens.py)."""
    model = kind_for(spec).model
    processor = model.processor(Path(model_dir))
    return lambda rows: model.encode(processor, rows, labels)
