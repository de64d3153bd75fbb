"""The model side of text classification: a text -> one of the spec's labels, through an encoder with a new
head.

Baseline: a fresh head would only measure its random initialisation, so the untouched encoder answers
zero-shot: each text gets the category whose description embeds closest to it (mean pooling, cosine).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from entrypoint.data.encoding import encode_classifications
from entrypoint.kinds.base import Baseline
from entrypoint.kinds.text import TextFields
from entrypoint.report.serving import LABEL_LINE, Usage
from entrypoint.training.model import adapt, classifier_options, load_adapter, load_encoder
from jobspec.schema import Adaptation, JobSpec

__all__ = ["TextClassifier"]

# A new head on top of the checkpoint: sequence classifiers call it `classifier` (BERT) or `score` (decoders).
NEW_HEAD = ("classifier", "score")


class TextClassifier:
    """The model side of text classification."""

    def __init__(self, spec: JobSpec):
        self.spec = spec

    def fields(self) -> TextFields:
        data = self.spec.data
        return TextFields(
            wanted={"text": data.text_field, "label": data.label_field},
            keys=("text",),
            leak_text=lambda row: row["text"],
            recipe_task="classification",
        )

    def processor(self, folder: Path):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list:
        index = {label: i for i, label in enumerate(labels)}
        max_length = self.spec.model.max_length
        texts, label_ids = [r["text"] for r in rows], [index[r["label"]] for r in rows]
        return encode_classifications(processor, texts, label_ids, max_length)

    def collator(self, processor):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(processor)

    def load(self, folder: Path, labels: Sequence[str], adaptation: Adaptation, trained: Path | None = None):
        from transformers import AutoModelForSequenceClassification

        if trained is not None and adaptation.method == "full":
            return AutoModelForSequenceClassification.from_pretrained(trained, **classifier_options(labels))
        if trained is not None:
            return load_adapter(
                AutoModelForSequenceClassification.from_pretrained(folder, **classifier_options(labels)), trained
            )
        model, info = AutoModelForSequenceClassification.from_pretrained(
            folder, **classifier_options(labels), output_loading_info=True
        )
        # SEQ_CLS puts the new head in modules_to_save, so it trains in full and is saved with the adapter.
        return adapt(model, info, folder, adaptation, new_head=NEW_HEAD, task_type="SEQ_CLS")

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        from entrypoint.evaluation.classify import predict_labels

        texts = [r["text"] for r in rows]
        return predict_labels(model, processor, texts, labels, self.spec.model.max_length, self._batch, device)

    def scores(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device):
        from entrypoint.evaluation.classify import label_logits

        texts = [r["text"] for r in rows]
        return label_logits(model, processor, texts, self.spec.model.max_length, self._batch, device)

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

    def settings(self) -> dict:
        return {"decoding": {"method": "argmax of the classifier logits"}}

    @property
    def _batch(self) -> int:
        return self.spec.training.eval_batch


def _call(base: str, folder: str, chat: bool) -> list[str]:
    """SERVING.md: the tokenizer saved with the export, one text, its label."""
    tokenizer = f'tokenizer = AutoTokenizer.from_pretrained("{folder}")'
    return [tokenizer, 'inputs = tokenizer("some text", return_tensors="pt")', LABEL_LINE]


USAGE = Usage("AutoModelForSequenceClassification", "AutoTokenizer", generative=False, call=_call)
