"""The model side of image classification (`data.modality: image`): an image file -> one of the spec's
labels, through a vision model with a new head (trained in full, or saved with the LoRA adapter).

Baseline: the untouched backbone's embedding and the nearest train-split category mean (a backbone has no
text to compare with).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from entrypoint.data.encoding import encode_image
from entrypoint.kinds.base import Baseline
from entrypoint.report.serving import LABEL_LINE, Usage
from entrypoint.training.model import adapt, classifier_options, load_adapter, load_encoder
from jobspec.schema import Adaptation, JobSpec

__all__ = ["ImageClassifier"]

NEW_HEAD = ("classifier",)


class ImageClassifier:
    """The model side of image classification."""

    def __init__(self, spec: JobSpec):
        self.spec = spec

    def processor(self, folder: Path):
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(folder)

    def encode(self, processor, rows: Sequence[dict], labels: Sequence[str]) -> list:
        index = {label: i for i, label in enumerate(labels)}
        modes = self.spec.data.image_modes
        return [encode_image(processor, r["path"], index[r["label"]], modes) for r in rows]

    def collator(self, processor):
        from transformers import default_data_collator

        return default_data_collator  # the processor makes every image the same size: stack them

    def load(self, folder: Path, labels: Sequence[str], adaptation: Adaptation, trained: Path | None = None):
        from transformers import AutoModelForImageClassification

        if trained is not None and adaptation.method == "full":
            return AutoModelForImageClassification.from_pretrained(trained, **classifier_options(labels))
        if trained is not None:
            model = AutoModelForImageClassification.from_pretrained(
                folder, **classifier_options(labels), ignore_mismatched_sizes=True
            )
            return load_adapter(model, trained)
        model, info = AutoModelForImageClassification.from_pretrained(
            folder, **classifier_options(labels), ignore_mismatched_sizes=True, output_loading_info=True
        )
        # the new head trains in full and is saved with the adapter
        return adapt(model, info, folder, adaptation, new_head=NEW_HEAD, saved=NEW_HEAD)

    def predict(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device) -> list[str]:
        from entrypoint.evaluation.classify import predict_image_labels

        paths, modes = [r["path"] for r in rows], self.spec.data.image_modes
        return predict_image_labels(model, processor, paths, labels, modes, self.spec.training.eval_batch, device)

    def scores(self, model, processor, rows: Sequence[dict], labels: Sequence[str], device):
        from entrypoint.evaluation.classify import image_logits

        paths, modes = [r["path"] for r in rows], self.spec.data.image_modes
        return image_logits(model, processor, paths, modes, self.spec.training.eval_batch, device)

    def baseline(self, folder: Path, processor, rows: Sequence[dict], labels: Sequence[str], device, train) -> Baseline:
        from entrypoint.evaluation.classify import centroid_labels

        outputs = centroid_labels(
            load_encoder(folder),
            processor,
            [(r["path"], r["label"]) for r in train()],
            [r["path"] for r in rows],
            labels,
            self.spec.data.image_modes,
            self.spec.training.eval_batch,
            device,
        )
        return Baseline(
            outputs, {"method": "nearest_train_centroid", "embedding": "pooler output or first token, cosine"}
        )

    def settings(self) -> dict:
        return {
            "decoding": {"method": "argmax of the classifier logits"},
            "modality": "image",
            "image_modes": self.spec.data.image_modes,
        }


def _call(base: str, folder: str, chat: bool) -> list[str]:
    """SERVING.md: the base model's image processor (the export keeps its preprocessing), one image, its label."""
    return [
        f'processor = AutoImageProcessor.from_pretrained("{base}")  # the base model\'s preprocessing',
        'inputs = processor(images=image, return_tensors="pt")  # image: a PIL image',
        LABEL_LINE,
    ]


USAGE = Usage("AutoModelForImageClassification", "AutoImageProcessor", generative=False, call=_call)
