"""Baseline phase: the untouched base model on the eval split, before any training (never the test split,
which stays sealed until one trial is chosen).

For an image model, the baseline is the untouched backbone's embeddings with the nearest category mean
of the train split. For a text encoder, a fresh classification head would only measure its random
initialisation, so the baseline is zero-shot: each text gets the category whose description embeds
closest to it. For a causal LM, the untouched model generates a response to each prompt with the same
decoding every trial uses. Per-example outputs, metrics and the full eval config are stored, so later
comparisons can be audited.
"""

from __future__ import annotations

from collections.abc import Sequence

from entrypoint.classify import centroid_labels, zero_shot_labels
from entrypoint.context import PhaseContext, to_jsonl
from entrypoint.evaluation import eval_config, predict, score
from entrypoint.model import hash_base_model, load_causal_lm, load_encoder, resolve_model_dir
from entrypoint.preprocess import is_causal, is_image, load_processor
from entrypoint.verdict import check_guardrails

__all__ = ["baseline_outputs", "run"]


def baseline_outputs(ctx: PhaseContext, rows: Sequence[dict]) -> tuple[list[str], dict]:
    """The untouched model's output for each row, and how it was obtained (added to the eval config)."""
    spec, labels = ctx.spec, ctx.labels
    folder = resolve_model_dir(spec.model)
    causal = is_causal(spec)
    tokenizer = load_processor(folder, spec)
    if is_image(spec):
        train = [(r["path"], r["label"]) for r in ctx.read_split("train")]
        outputs = centroid_labels(
            load_encoder(folder),
            tokenizer,
            train,
            [r["path"] for r in rows],
            labels,
            spec.data.image_modes,
            spec.training.eval_batch,
            ctx.device,
        )
        return outputs, {"method": "nearest_train_centroid", "embedding": "pooler output or first token, cosine"}
    if causal:
        return predict(load_causal_lm(folder), tokenizer, rows, spec, labels, ctx.device), {
            "method": "untouched_model_generation"
        }
    described = spec.hypothesis.label_descriptions
    label_texts = [described.get(label, label.replace("_", " ")) for label in labels]
    outputs = zero_shot_labels(
        load_encoder(folder),
        tokenizer,
        [r["text"] for r in rows],
        label_texts,
        labels,
        spec.model.max_length,
        spec.training.eval_batch,
        ctx.device,
    )
    return outputs, {
        "method": "zero_shot_similarity",
        "pooling": "mean",
        "label_texts": dict(zip(labels, label_texts, strict=True)),
    }


def run(ctx: PhaseContext) -> dict:
    rows = ctx.read_split("eval")
    outputs, method = baseline_outputs(ctx, rows)
    report = score(ctx.spec, rows, outputs, ctx.labels)
    # Every guardrail must name a metric this job computes: checked now, not after days of training.
    check_guardrails(ctx.spec.guardrails, report["metrics"], report["metrics"])
    base_sha = hash_base_model(resolve_model_dir(ctx.spec.model)).sha256
    data_version = ctx.read_json("phases/data/result.json")["data_version"]
    config = {**eval_config(ctx.spec, "eval", data_version, base_sha), "baseline": method}
    ctx.store.put_bytes(
        "phases/baseline/predictions.jsonl",
        to_jsonl({**row, "output": o} for row, o in zip(rows, outputs, strict=True)),
    )
    ctx.write_json("phases/baseline/eval_config.json", config)
    ctx.write_json("phases/baseline/metrics.json", report)
    metric = ctx.spec.hypothesis.metric
    ctx.log(f"baseline: {method['method']} {metric} {report['metrics'][metric]:.3f} on {report['n']} eval examples")
    return {"metrics": report["metrics"], "eval_config": config}
