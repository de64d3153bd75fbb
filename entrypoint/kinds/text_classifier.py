"""Text classification: a text -> one of the spec's labels, through an encoder with a new head.

Baseline: a fresh head would only measure its random initialisation, so the untouched encoder answers
zero-shot: each text gets the category whose description embeds closest to it (mean pooling, cosine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from entrypoint.data.encoding import encode_classification
from entrypoint.data.text import read_text_parts, text_inspection, text_leaks, text_recipe
from entrypoint.kinds import Baseline, DataParts, Leaks
from entrypoint.training.model import adapt, classifier_options, load_adapter, load_encoder
from jobspec.schema import Adaptation, JobSpec

__all__ = ["TextClassifier"]

# A new head on top of the checkpoint: sequence classifiers call it `classifier` (BERT) or `score` (decoders).
NEW_HEAD = ("classifier", "score")


class TextClassifier:
    name = "text_classifier"
    token_loss = False  # one label per sequence: the loss is per example
    stores_tokens = True

    def __init__(self, spec: JobSpec):
        self.spec = spec

    # -- data phase ------------------------------------------------------------------------------------
    def read(self, folder: Path, log: Callable[[str], None]) -> DataParts:
        data = self.spec.data
        wanted = {"text": data.text_field, "label": data.label_field}
        return read_text_parts(self.spec, folder, log, wanted, ("text",))

    def find_leaks(self, splits: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> Leaks:
        return text_leaks(splits, pairs, self.spec.data.leaks.near_threshold, lambda row: row["text"])

    def commit_splits(self, store, splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
        return splits  # the rows themselves are canonical

    def identity(self, row: dict) -> dict:
        return row  # a text row is its content

    def recipe(self, folder: Path, processor) -> dict:
        return text_recipe(self.spec, folder, "classification")

    def inspect(self, processor, splits: dict[str, list[dict]], labels: list[str], encoded) -> tuple[dict, str, dict]:
        return text_inspection(self, processor, splits, labels, encoded)

    def fetch(self, store, rows: list[dict], workdir: Path) -> list[dict]:
        return rows  # everything is in the row

    # -- model -----------------------------------------------------------------------------------------
    def processor(self, folder: Path):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list:
        index = {label: i for i, label in enumerate(labels)}
        max_length = self.spec.model.max_length
        return [encode_classification(processor, r["text"], index[r["label"]], max_length) for r in rows]

    def collator(self, processor):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(processor)

    def build(self, folder: Path, labels: Sequence[str], adaptation: Adaptation):
        from transformers import AutoModelForSequenceClassification

        model, info = AutoModelForSequenceClassification.from_pretrained(
            folder, **classifier_options(labels), output_loading_info=True
        )
        # SEQ_CLS puts the new head in modules_to_save, so it trains in full and is saved with the adapter.
        return adapt(model, info, folder, adaptation, new_head=NEW_HEAD, task_type="SEQ_CLS")

    def reload(self, base: Path, weights: Path, labels: Sequence[str], method: str):
        from transformers import AutoModelForSequenceClassification

        if method == "full":
            return AutoModelForSequenceClassification.from_pretrained(weights, **classifier_options(labels))
        return load_adapter(
            AutoModelForSequenceClassification.from_pretrained(base, **classifier_options(labels)), weights
        )

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        from entrypoint.evaluation.classify import predict_labels

        texts = [r["text"] for r in rows]
        return predict_labels(model, processor, texts, labels, self.spec.model.max_length, self._batch, device)

    def baseline(self, folder: Path, processor, rows: Sequence[dict], labels: Sequence[str], device, train) -> Baseline:
        from entrypoint.evaluation.classify import zero_shot_labels

        described = self.spec.hypothesis.label_descriptions
        label_texts = [described.get(label, label.replace("_", " ")) for label in labels]
        outputs = zero_shot_labels(
            load_encoder(folder),
            processor,
            [r["text"] for r in rows],
            label_texts,
            labels,
            self.spec.model.max_length,
            self._batch,
            device,
        )
        method = {
            "method": "zero_shot_similarity",
            "pooling": "mean",
            "label_texts": dict(zip(labels, label_texts, strict=True)),
        }
        return Baseline(outputs, method)

    def eval_settings(self) -> dict:
        return {"decoding": {"method": "argmax of the classifier logits"}}

    @property
    def _batch(self) -> int:
        return self.spec.training.eval_batch
