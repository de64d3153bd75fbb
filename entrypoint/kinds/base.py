"""The three protocols of kinds/ (see the package docstring), the untouched model's `Baseline` and the
`Kind` bundle. The implementations import this module only, never the package, so that kinds/ holds no
import cycle of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from entrypoint.data.encoding import Encoded
from entrypoint.data.parts import DataParts, Leaks
from entrypoint.evaluation.tally import Tally
from entrypoint.report.serving import Usage
from jobspec.schema import Adaptation

__all__ = ["Baseline", "DataSide", "Kind", "ModelSide", "Serving", "TaskSide"]


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
class Serving:
    """How an export of this kind is served and checked against its adapter (trial/export.py, trial/parity.py)."""

    # (model, processor, rows, labels, device) -> the logits each row's answer is read from, one row each
    # (float32, CPU): a classifier's, or the first generated token's. The parity check compares them.
    scores: Callable[..., Any]
    # A generative model's stop tokens besides eos (processor -> the chat template's end of turn), which the
    # merged folder's generation_config.json and the Ollama Modelfile stop at; None: not generative.
    stop_tokens: Callable[[Any], list[str]] | None
    # The share of eval predictions the merged model must answer as the adapter does (classifiers), or None
    # (generated answers: their metric alone decides).
    agreement: float | None
    # How user code loads and calls the export (SERVING.md's snippets), and whether the model generates.
    usage: Usage

    @property
    def labels(self) -> bool:
        """The model's outputs are indices into the job's labels (a model that does not generate: a
        classifier); the export carries them in order (export/labels.json, BINDING.json's `labels`)."""
        return not self.usage.generative


@dataclass(frozen=True)
class Kind:
    """One job's three sides. `stores_tokens`: the data phase stores the encoded splits (data/tokens.py)
    that later phases memory-map; otherwise (pixels) each phase encodes the rows it reads.
    `encodes_in_tokenizer`: the kind's `encode` spends nearly all its time inside the fast tokenizer,
    whose own threads then use every core in this process; otherwise (chat templates rendered per row in
    Python) large splits are encoded by a process per core."""

    name: str  # "text_classifier" | "image_classifier" | "causal_lm"
    data: DataSide
    model: ModelSide
    task: TaskSide
    stores_tokens: bool
    serving: Serving
    encodes_in_tokenizer: bool = False
