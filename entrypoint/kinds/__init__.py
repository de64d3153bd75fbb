"""The kinds of job rentune trains, one module each, behind one `JobKind` protocol chosen once from the spec.

    text_classifier.py    text -> one of `labels` (an encoder with a new head); zero-shot baseline
    image_classifier.py   image file -> one of `labels` (a vision model with a new head); centroid baseline
    causal_lm.py          prompt -> generated response (format adherence, extraction); untouched-model baseline

Phases never ask which kind they run: they call `ctx.kind`. Adding a kind is one new module implementing
`JobKind`, plus its spec fields in jobspec/schema.py and a line in `kind_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jobspec.schema import Adaptation, JobSpec

__all__ = ["Baseline", "DataParts", "JobKind", "Leaks", "kind_for"]


@dataclass
class DataParts:
    """What a kind read from the spec's data sources: rows per source (`all`, or `train`/`eval`/`test`),
    each with a `label` (a list, or rows spooled to disk: data/spool.py), and the counts the data phase
    reports."""

    rows: dict[str, Sequence[dict]]
    read: dict[str, int]
    duplicates: int
    summary: dict = field(default_factory=dict)  # kind-specific: source hashes, cleaning counts
    spools: list = field(default_factory=list)  # data.spool.Spool files, removed when the data phase ends


@dataclass(frozen=True)
class Leaks:
    found: list  # data.leaks.LeakPair
    shown: dict[str, list[str]]  # what names each row in messages (its text, or the image's file name)
    method: str
    threshold: float


@dataclass(frozen=True)
class Baseline:
    outputs: list[str]
    method: dict  # how they were obtained; goes into the eval config


class JobKind(Protocol):
    """Everything that differs between kinds of job. Each method states what every kind must return."""

    name: str  # "text_classifier" | "image_classifier" | "causal_lm"
    token_loss: bool  # loss normalised per token across an accumulated batch (else per example)
    stores_tokens: bool  # the data phase stores encoded splits (data/tokens.py) that later phases map

    # -- data phase ------------------------------------------------------------------------------------
    def read(self, folder: Path, log: Callable[[str], None]) -> DataParts:
        """Read, check, clean and de-duplicate the sources (spooling rows to `folder` when the kind streams
        them; progress to `log`). Raises DataError naming file and line."""

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
        splits as encoded once by the data phase (stores_tokens kinds), else None."""

    def fetch(self, store, rows: list[dict], workdir: Path) -> list[dict]:
        """Committed rows made ready for the model on this node (images downloaded and checked)."""

    # -- model -----------------------------------------------------------------------------------------
    def processor(self, folder: Path):
        """What turns a row into model inputs: the tokenizer, or the image processor."""

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list:
        """Every row exactly as the trainer sees it (data.encoding.Encoded)."""

    def collator(self, processor) -> Any:
        """Pads or stacks a list of encoded features into a batch."""

    def build(self, folder: Path, labels: Sequence[str], adaptation: Adaptation):
        """The model to train, LoRA-wrapped or fully trainable. Raises ModelError for unusable settings."""

    def reload(self, base: Path, weights: Path, labels: Sequence[str], method: str):
        """A trained model the way a user loads it: base + adapter, or the saved full model."""

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        """The model's output for each row: a label, or the generated response."""

    def baseline(self, folder: Path, processor, rows: Sequence[dict], labels: Sequence[str], device, train) -> Baseline:
        """The untouched model's outputs on `rows` (`train`: a callable returning the train split)."""

    def eval_settings(self) -> dict:
        """What besides the task decides a measurement (decoding, template, image modes)."""


def kind_for(spec: JobSpec) -> JobKind:
    """The kind of job `spec` describes: images -> image classifier; format and extraction tasks generate
    text -> causal LM; classification of text -> text classifier."""
    if spec.data.modality == "image":
        from entrypoint.kinds.image_classifier import ImageClassifier

        return ImageClassifier(spec)
    if spec.hypothesis.task in ("format", "extraction"):
        from entrypoint.kinds.causal_lm import CausalLM

        return CausalLM(spec)
    from entrypoint.kinds.text_classifier import TextClassifier

    return TextClassifier(spec)
