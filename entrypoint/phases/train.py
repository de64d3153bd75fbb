"""Train phase: fit the adapter (or the full model) on the train split with the HF Trainer, then commit
the trained weights and the eval predictions they give, for the evaluate phase to check against."""

from __future__ import annotations

import shutil

from transformers import AutoTokenizer, set_seed

from entrypoint.classify import encode, predict_labels
from entrypoint.context import PhaseContext, to_jsonl
from entrypoint.model import build_classifier, resolve_model_dir
from entrypoint.store import put_tree
from entrypoint.trainer import ProgressCallback, build_trainer

__all__ = ["TRIAL_ID", "run"]

TRIAL_ID = "main"  # one trial until the spec grows `experiments:`


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    set_seed(spec.training.seed)
    folder = resolve_model_dir(spec.model)
    labels = ctx.labels
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = build_classifier(folder, labels, spec.adaptation)
    features = encode(tokenizer, ctx.read_split("train"), labels, spec.model.max_length)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    ctx.log(
        f"train: {len(features)} examples, {trainable:,} of {total:,} parameters trainable ({spec.adaptation.method})"
    )

    progress = ProgressCallback(ctx.log)
    out = ctx.workdir / "trials" / TRIAL_ID
    trainer = build_trainer(
        model, tokenizer, features, spec.training, out / "trainer", ctx.device.type == "cpu", [progress]
    )
    outcome = trainer.train()

    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    trainer.model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    keys = put_tree(ctx.store, f"trials/{TRIAL_ID}/final", final)

    eval_rows = ctx.read_split("eval")
    predicted = predict_labels(
        trainer.model,
        tokenizer,
        [r["text"] for r in eval_rows],
        labels,
        spec.model.max_length,
        spec.training.eval_batch,
        ctx.device,
    )
    ctx.store.put_bytes(
        f"trials/{TRIAL_ID}/eval_predictions_at_end.jsonl", to_jsonl({"predicted": p} for p in predicted)
    )
    return {
        "trial_id": TRIAL_ID,
        "steps": trainer.state.global_step,
        "train_loss": outcome.training_loss,
        "losses": progress.losses,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "weights": keys,
        "seconds": outcome.metrics.get("train_runtime"),
    }
