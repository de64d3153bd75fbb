"""Train phase: fit the adapter (or the full model) on the train split with the HF Trainer.

Checkpoints are committed to the store during training (every N steps and/or minutes, on SIGTERM and at
the end). A process that starts this phase again, on any node, resumes from the newest checkpoint that
verifies, with optimizer, scheduler, RNG states and data position, so the run continues as if never
stopped. At the end the trained weights and the eval predictions they give are committed, for the
evaluate phase to check against.
"""

from __future__ import annotations

import shutil

from transformers import AutoTokenizer, set_seed

from entrypoint.checkpoint import CheckpointError, checkpoint_prefix, find_latest
from entrypoint.classify import predict_labels
from entrypoint.context import PhaseContext, to_jsonl
from entrypoint.envinfo import environment
from entrypoint.model import build_model, hash_base_model, resolve_model_dir
from entrypoint.preprocess import collator, encode_rows, is_causal, prepare_tokenizer
from entrypoint.store import put_tree
from entrypoint.trainer import (
    FirstStepsCallback,
    Interrupted,
    ProgressCallback,
    StoreCheckpointCallback,
    build_trainer,
    graceful_sigterm,
)

__all__ = ["TRIAL_ID", "run"]

TRIAL_ID = "main"  # one trial until the spec grows `experiments:`


def _checkpoint_meta(ctx: PhaseContext, base_sha256: str) -> dict:
    env = environment()
    return {
        "trial_id": TRIAL_ID,
        "spec_sha256": ctx.spec_sha256,
        "data_version": ctx.read_json("phases/data/result.json")["data_version"],
        "base_model_sha256": base_sha256,
        "env": {"torch": env["torch"], "backend": env["backend"], "transformers": env["packages"]["transformers"]},
    }


def run(ctx: PhaseContext) -> dict:
    spec = ctx.spec
    set_seed(spec.training.seed)
    folder = resolve_model_dir(spec.model)
    labels = ctx.labels
    causal = is_causal(spec)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(folder), causal)
    model = build_model(folder, causal, labels, spec.adaptation)
    features = [e.features for e in encode_rows(tokenizer, ctx.read_split("train"), spec, labels)]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    ctx.log(
        f"train: {len(features)} examples, {trainable:,} of {total:,} parameters trainable ({spec.adaptation.method})"
    )

    meta = _checkpoint_meta(ctx, hash_base_model(folder).sha256)
    prefix = checkpoint_prefix(TRIAL_ID)
    out = ctx.workdir / "trials" / TRIAL_ID
    shutil.rmtree(out, ignore_errors=True)  # local scratch is never trusted across processes
    resume = find_latest(ctx.store, prefix, out / "resume", ctx.log)
    if resume is not None:
        for field in ("spec_sha256", "data_version", "base_model_sha256"):
            if resume.manifest.get(field) != meta[field]:
                raise CheckpointError(
                    f"checkpoint step {resume.step}: {field} differs from this job's; refusing to resume from it"
                )
        ctx.log(f"train: resuming from committed checkpoint step {resume.step}")

    with graceful_sigterm(spec.training.checkpoint.grace_seconds, ctx.log) as sigterm:
        saver = StoreCheckpointCallback(ctx.store, prefix, meta, spec.training.checkpoint, sigterm, ctx.log)
        first_steps = FirstStepsCallback(spec.adaptation.method, ctx.device)
        trainer = build_trainer(
            model,
            collator(tokenizer, causal),
            features,
            spec.training,
            out / "trainer",
            ctx.device.type == "cpu",
            [ProgressCallback(ctx.log), saver, first_steps],
            token_normalized_loss=causal,
        )
        outcome = trainer.train(resume_from_checkpoint=str(resume.folder) if resume else None)
        if sigterm.requested.is_set() and trainer.state.global_step < trainer.state.max_steps:
            raise Interrupted(
                f"train: stopped on SIGTERM at step {trainer.state.global_step}/{trainer.state.max_steps}; "
                f"committed checkpoints: {saver.committed or 'none in this process'}"
            )

    final = out / "final"
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
    predicted = ctx.read_json("phases/probe/result.json")["predicted_peak_bytes"]
    return {
        "trial_id": TRIAL_ID,
        "parameter_check": {"passed": first_steps.check.done, **first_steps.check.summary()},
        "memory": {
            "first_steps_peak_bytes": first_steps.peak_bytes,
            "probe_predicted_peak_bytes": predicted,
            "actual_over_predicted": first_steps.peak_bytes / predicted if first_steps.peak_bytes else None,
        },
        "steps": trainer.state.global_step,
        "resumed_from_step": resume.step if resume else None,
        "train_loss": outcome.training_loss,
        "losses": [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e],
        "checkpoints_committed": saver.committed,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "weights": keys,
    }
