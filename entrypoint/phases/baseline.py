"""Baseline phase: the untouched base model on the eval split, before any training.

A fresh classification head would only measure its random initialisation, so the baseline for an
encoder is zero-shot: each text gets the category whose description embeds closest to it. Per-example
outputs, metrics and the full eval config are stored, so later comparisons can be audited.
"""

from __future__ import annotations

from transformers import AutoTokenizer

from entrypoint.classify import zero_shot_labels
from entrypoint.context import PhaseContext, to_jsonl
from entrypoint.metrics import METRICS_VERSION, classification_report
from entrypoint.model import hash_base_model, load_encoder, resolve_model_dir

__all__ = ["run"]


def run(ctx: PhaseContext) -> dict:
    folder = resolve_model_dir(ctx.spec.model)
    labels = ctx.labels
    rows = ctx.read_split("eval")
    described = ctx.spec.hypothesis.label_descriptions
    label_texts = [described.get(label, label.replace("_", " ")) for label in labels]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoder = load_encoder(folder)
    predicted = zero_shot_labels(
        encoder,
        tokenizer,
        [r["text"] for r in rows],
        label_texts,
        labels,
        ctx.spec.model.max_length,
        ctx.spec.training.eval_batch,
        ctx.device,
    )
    report = classification_report([r["label"] for r in rows], predicted, labels)
    config = {
        "method": "zero_shot_similarity",
        "pooling": "mean",
        "label_texts": dict(zip(labels, label_texts, strict=True)),
        "split": "eval",
        "data_version": ctx.read_json("phases/data/result.json")["data_version"],
        "base_model_sha256": hash_base_model(folder).sha256,
        "max_length": ctx.spec.model.max_length,
        "metrics_version": METRICS_VERSION,
    }
    ctx.store.put_bytes(
        "phases/baseline/predictions.jsonl",
        to_jsonl({**row, "predicted": p} for row, p in zip(rows, predicted, strict=True)),
    )
    ctx.write_json("phases/baseline/eval_config.json", config)
    ctx.write_json("phases/baseline/metrics.json", report)
    ctx.log(f"baseline: zero-shot macro-F1 {report['macro_f1']:.3f} on {report['n']} eval examples")
    return {"metrics": report, "eval_config": config}
